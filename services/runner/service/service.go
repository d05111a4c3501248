// Package service wires the ACP runner (docs/runner.md) into a runnable server. It
// is the one entry point shared by cmd/runner and `conclave dev`.
package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/govern"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/api"
	"github.com/conclave-ai/conclave/services/runner/internal/covenlink"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/hostlink"
	"github.com/conclave-ai/conclave/services/runner/internal/metrics"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
	"github.com/conclave-ai/conclave/services/runner/internal/supervisor"
)

// Config is the runner's configuration.
type Config struct {
	GRPCAddr        config.ListenAddr `env:"CONCLAVE_RUNNER_GRPC_ADDR" default:":50052" help:"gRPC listener (conclave.runner.v1)"`
	HTTPAddr        config.ListenAddr `env:"CONCLAVE_RUNNER_HTTP_ADDR" default:":8082" help:"HTTP listener: REST /api/v1, health and metrics"`
	ServerID        string            `env:"CONCLAVE_RUNNER_SERVER_ID" help:"this replica's name in event sources (default: the host name)"`
	AdvertiseAddr   string            `env:"CONCLAVE_RUNNER_ADVERTISE_ADDR" help:"host:port other replicas reach this one's gRPC listener at, to forward requests for the agents it runs (default: the listener's address, or the host name and port)"`
	ForwardTimeout  time.Duration     `env:"CONCLAVE_RUNNER_FORWARD_TIMEOUT" default:"10s" validate:"positive" help:"how long a prompt, cancel or delete forwarded to the replica running the instance's agent may take before that replica is taken as unreachable"`
	AgentTypesFile  string            `env:"CONCLAVE_RUNNER_AGENT_TYPES" help:"YAML file of agent types, overlaid on the defaults"`
	WorkspaceRoots  []string          `env:"CONCLAVE_RUNNER_WORKSPACE_ROOTS" help:"comma-separated directories a launch's workspace_path must lie within"`
	Workers         int               `env:"CONCLAVE_RUNNER_WORKERS" default:"8" help:"agents this replica runs at once (launch workers)"`
	LaunchQueue     string            `env:"CONCLAVE_RUNNER_LAUNCH_QUEUE" default:"runner-launches" help:"queue of launches"`
	EventsQueue     string            `env:"CONCLAVE_RUNNER_EVENTS_QUEUE" default:"bus-events" help:"queue the bus publishes task events from"`
	LaunchRetry     time.Duration     `env:"CONCLAVE_RUNNER_LAUNCH_RETRY" default:"30s" help:"how soon a launch whose runner died is retried by another"`
	ProtocolTimeout time.Duration     `env:"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT" default:"30s" validate:"positive" help:"how long an agent may take to answer initialize, session/new, session/load or to accept a prompt before its protocol is declared dead"`
	SilenceTimeout  time.Duration     `env:"CONCLAVE_RUNNER_SILENCE_TIMEOUT" default:"10m" validate:"positive" help:"how long an agent may send nothing on stdout in the middle of a turn before its protocol is declared dead (an agent type's silence_timeout overrides it)"`
	CancelGrace     time.Duration     `env:"CONCLAVE_RUNNER_CANCEL_GRACE" default:"10s" validate:"positive" help:"how long an agent may take to end a cancelled turn before it is killed"`
	IdleTimeout     time.Duration     `env:"CONCLAVE_RUNNER_IDLE_TIMEOUT" default:"10m" validate:"positive" help:"how long an idle agent is kept for more prompts; later prompts resume its session in a new process"`
	MaxLineBytes    int               `env:"CONCLAVE_RUNNER_MAX_LINE_BYTES" default:"4194304" help:"longest line accepted from an agent; longer ones are dropped"`
	ShutdownTimeout time.Duration     `env:"CONCLAVE_RUNNER_SHUTDOWN_TIMEOUT" default:"15s" validate:"positive" help:"how long in-flight requests may drain on shutdown"`
	ClientTokens    []string          `env:"CONCLAVE_RUNNER_CLIENT_TOKENS" help:"comma-separated bearer tokens accepted on the API"`
	ClientRate      float64           `env:"CONCLAVE_RUNNER_CLIENT_RATE" default:"50" help:"API requests per second each client (bearer token) may make on one replica"`
	ClientBurst     int               `env:"CONCLAVE_RUNNER_CLIENT_BURST" default:"100" validate:"positive" help:"API requests each client may make at once, above its rate"`
	// AllowUnauthenticated opens the API without tokens; conclave dev sets
	// it, on loopback only.
	AllowUnauthenticated bool `env:"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED" default:"false" help:"serve the API without bearer tokens (development only)"`
	// AllowedHosts are answered besides loopback names while the runner
	// runs without authentication.
	AllowedHosts []string `env:"CONCLAVE_RUNNER_ALLOWED_HOSTS" help:"comma-separated Host names the HTTP listener answers besides localhost, 127.0.0.1 and [::1] while it runs without authentication"`
	// AuthThrottle is the per-address budget of wrong tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_RUNNER_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`

	// The librarian permission policy (docs/governance.md).
	LibrarianURL    string   `env:"CONCLAVE_RUNNER_LIBRARIAN_URL" help:"the Librarian's API (http(s)://host[:port][/stage], e.g. API Gateway's) that agent types with permission librarian ask; required when one does"`
	LibrarianTokens []string `env:"CONCLAVE_RUNNER_LIBRARIAN_TOKENS" help:"comma-separated agent_type=token pairs: each librarian-governed agent type's Librarian agent token (its agent_id is the type's id); empty only for a Librarian that takes no tokens (development)"`
	BusURL          string   `env:"CONCLAVE_RUNNER_BUS_URL" help:"the bus's WebSocket URL (ws:// or wss://), where the Librarian's decisions arrive on system:librarian.request.*; required with permission librarian"`
	BusToken        string   `env:"CONCLAVE_RUNNER_BUS_TOKEN" help:"bearer token of a bus grant that may subscribe to system:librarian.request.*"`

	// GatewayAddr is the coven gateway's AgentStream endpoint, its load
	// balancer: agents whose type or launch asks for it register there.
	GatewayAddr      string        `env:"CONCLAVE_RUNNER_GATEWAY_ADDR" help:"the coven gateway's AgentStream address (host:port of its load-balanced endpoint, or a gRPC target such as dns:///gateway:50051) agents with gateway: true register at; empty: none do"`
	GatewayHeartbeat time.Duration `env:"CONCLAVE_RUNNER_GATEWAY_HEARTBEAT" default:"10s" help:"how often each agent registered at the gateway sends a Heartbeat (0: never); keep it under a third of the gateway's CONCLAVE_GATEWAY_AGENT_TIMEOUT when that is set"`
	// GatewayToken authenticates those registrations: a secret.
	GatewayToken string `env:"CONCLAVE_RUNNER_GATEWAY_TOKEN" help:"bearer token the runner's agents present to the gateway: the token of a pattern entry of the gateway's CONCLAVE_GATEWAY_AGENT_TOKENS (*=token, or prefix*=token)"`

	Executor string `env:"CONCLAVE_RUNNER_EXECUTOR" default:"local" help:"where agents run: local (a process group on this host, spoken to over stdio) or kubernetes (a Job per launch, behind agent-host; docs/runner.md)"`
	// HostKey signs the per-instance tokens agent-host presents: a secret.
	HostKey          string        `env:"CONCLAVE_RUNNER_HOST_KEY" help:"secret key (at least 32 bytes) the per-instance tokens of agent-host are signed with; required by the kubernetes executor, the same on every replica"`
	HostAddr         string        `env:"CONCLAVE_RUNNER_HOST_ADDR" help:"host:port agents' pods dial this replica's gRPC listener at (default: CONCLAVE_RUNNER_ADVERTISE_ADDR)"`
	HostStartTimeout time.Duration `env:"CONCLAVE_RUNNER_HOST_START_TIMEOUT" default:"5m" help:"how long a Kubernetes launch may take from its Job's creation to agent-host reporting the agent's session up (scheduling, image pulls, the agent's start)"`
	HostOTLPEndpoint string        `env:"CONCLAVE_RUNNER_HOST_OTLP_ENDPOINT" help:"OTLP gRPC endpoint (host:port, reachable from agents' pods) agent-host exports its spans to; empty: they are not exported (the launch's trace still continues in the agent's updates)"`
	// HostGatewayAddr is where agent-host, in an agent's pod, dials the
	// gateway to register the agent there itself.
	HostGatewayAddr string        `env:"CONCLAVE_RUNNER_HOST_GATEWAY_ADDR" help:"the coven gateway's AgentStream address as agents' pods reach it (its Service, the load-balanced endpoint), where agent-host registers agents on the gateway with the token of CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET (default: CONCLAVE_RUNNER_GATEWAY_ADDR)"`
	HostExitGrace   time.Duration `env:"CONCLAVE_RUNNER_HOST_EXIT_GRACE" default:"30s" help:"how long an agent's Job may take to finish once agent-host was told to end it, before it is deleted"`
	executor.KubeConfig
}

// Executors the runner can run agents on.
const (
	ExecutorLocal      = "local"
	ExecutorKubernetes = "kubernetes"
)

// minHostKeyBytes is the shortest CONCLAVE_RUNNER_HOST_KEY: an HMAC key of
// SHA-256's block of entropy.
const minHostKeyBytes = 32

// Validate implements config.Validator.
func (c Config) Validate() error {
	if err := config.Check(c); err != nil {
		return err
	}
	if c.GRPCAddr == "" {
		return fmt.Errorf("CONCLAVE_RUNNER_GRPC_ADDR: the runner needs a gRPC listener")
	}
	if len(c.ClientTokens) == 0 && !c.AllowUnauthenticated {
		return fmt.Errorf("CONCLAVE_RUNNER_CLIENT_TOKENS: set at least one client token, or CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED=true for development")
	}
	if err := auth.CheckTokens("CONCLAVE_RUNNER_CLIENT_TOKENS", c.ClientTokens...); err != nil {
		return err
	}
	if c.AllowUnauthenticated {
		if err := httpguard.CheckListen("CONCLAVE_RUNNER_GRPC_ADDR", string(c.GRPCAddr), "CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED"); err != nil {
			return err
		}
		if err := httpguard.CheckListen("CONCLAVE_RUNNER_HTTP_ADDR", string(c.HTTPAddr), "CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED"); err != nil {
			return err
		}
	}
	if len(c.WorkspaceRoots) == 0 {
		return fmt.Errorf("CONCLAVE_RUNNER_WORKSPACE_ROOTS: set the directories workspaces may lie within")
	}
	for _, r := range c.WorkspaceRoots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("CONCLAVE_RUNNER_WORKSPACE_ROOTS: %q is not an absolute path", r)
		}
	}
	if !(c.ClientRate > 0) || c.ClientRate > 1e9 {
		return fmt.Errorf("CONCLAVE_RUNNER_CLIENT_RATE: must be a positive number, got %g", c.ClientRate)
	}
	if c.Workers < 1 || c.Workers > 10000 {
		return fmt.Errorf("CONCLAVE_RUNNER_WORKERS: must be 1..10000, got %d", c.Workers)
	}
	if c.MaxLineBytes < 1024 {
		return fmt.Errorf("CONCLAVE_RUNNER_MAX_LINE_BYTES: must be at least 1024, got %d", c.MaxLineBytes)
	}
	if c.LaunchRetry < time.Second || c.LaunchRetry > queue.MaxVisibility {
		return fmt.Errorf("CONCLAVE_RUNNER_LAUNCH_RETRY: must be 1s..%s, got %s", queue.MaxVisibility, c.LaunchRetry)
	}
	registry, err := agenttype.Load(c.AgentTypesFile)
	if err != nil {
		return fmt.Errorf("CONCLAVE_RUNNER_AGENT_TYPES: %w", err)
	}
	if err := c.validateGovernance(registry); err != nil {
		return err
	}
	if c.GatewayHeartbeat < 0 {
		return fmt.Errorf("CONCLAVE_RUNNER_GATEWAY_HEARTBEAT: must not be negative, got %s", c.GatewayHeartbeat)
	}
	if c.GatewayToken != "" {
		if err := auth.CheckTokens("CONCLAVE_RUNNER_GATEWAY_TOKEN", c.GatewayToken); err != nil {
			return err
		}
	}
	switch c.Executor {
	case ExecutorLocal:
	case ExecutorKubernetes:
		if len(c.HostKey) < minHostKeyBytes {
			return fmt.Errorf("CONCLAVE_RUNNER_HOST_KEY: the kubernetes executor needs a key of at least %d bytes, the same on every replica", minHostKeyBytes)
		}
		if c.HostStartTimeout <= 0 || c.HostExitGrace <= 0 {
			return fmt.Errorf("CONCLAVE_RUNNER_HOST_START_TIMEOUT and CONCLAVE_RUNNER_HOST_EXIT_GRACE: must be positive, got %s and %s", c.HostStartTimeout, c.HostExitGrace)
		}
		if c.HostAddr != "" {
			if _, _, err := net.SplitHostPort(c.HostAddr); err != nil {
				return fmt.Errorf("CONCLAVE_RUNNER_HOST_ADDR: %w", err)
			}
		}
		if c.HostImage == "" {
			return fmt.Errorf("CONCLAVE_RUNNER_KUBE_HOST_IMAGE: the kubernetes executor needs the agent-host image")
		}
	default:
		return fmt.Errorf("CONCLAVE_RUNNER_EXECUTOR: %q is not local or kubernetes", c.Executor)
	}
	return c.KubeConfig.Validate()
}

// Tables lists the tables the runner keeps its state in.
var Tables = []store.Table{records.Table}

// Queues are the runner's queues, for the given names: launches (with a
// dead-letter queue for launches that keep failing to be handled) and the
// bus's events queue, defined as the bus defines it.
func Queues(cfg Config) []queue.Definition {
	defs := []queue.Definition{{Name: cfg.LaunchQueue, VisibilityTimeout: cfg.LaunchRetry, MaxReceiveCount: 10}}
	// A launch queue per priority above 0, sharing the priority 0 queue's
	// dead-letter queue.
	for p := 1; p <= supervisor.MaxPriority; p++ {
		defs = append(defs, queue.Definition{Name: supervisor.LaneQueue(cfg.LaunchQueue, p), VisibilityTimeout: cfg.LaunchRetry,
			MaxReceiveCount: 10, DeadLetterQueue: cfg.LaunchQueue + "-dlq"})
	}
	return append(defs, queue.Definition{Name: cfg.EventsQueue, VisibilityTimeout: 2 * time.Minute, MaxReceiveCount: 5})
}

// ProcessDirName is Deps.ProcessDir's name under CONCLAVE_DATA_DIR.
const ProcessDirName = "runner-agents"

// Deps are what the runner runs on.
type Deps struct {
	Store     store.Store
	Queue     queue.Queue
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
	// Executor, when set, replaces the executor Config.Executor names (with
	// a local one's stdio; tests).
	Executor executor.Executor
	// Kube, when set, is the Kubernetes executor's client configuration
	// in place of CONCLAVE_RUNNER_KUBE_KUBECONFIG or the in-cluster one.
	Kube *rest.Config
	// ProcessDir, when set, is where the local executor records the agent
	// processes it starts (cmd/runner and conclave dev: runner-agents under
	// CONCLAVE_DATA_DIR), so that a runner started after a crash first ends
	// those the crashed one left running. A directory that cannot be used
	// is logged, and the runner runs without the records.
	ProcessDir string
	// BeforeEventSend, when set, sees each event envelope before it is
	// sent to the events queue: a crash point for tests (cmd/runner sets
	// it only under CONCLAVE_RUNNER_TEST_CRASHPOINT).
	BeforeEventSend func(*eventsv1.Envelope)
	// LibrarianURL and BusURL, when set, give the Librarian's and the
	// bus's addresses in place of CONCLAVE_RUNNER_LIBRARIAN_URL and
	// CONCLAVE_RUNNER_BUS_URL: conclave dev's, known once they listen.
	LibrarianURL, BusURL func() string
	// GatewayDialOptions are added to the dial of CONCLAVE_RUNNER_GATEWAY_ADDR
	// (conclave dev: a dialer that waits for its gateway's listener).
	GatewayDialOptions []grpc.DialOption
}

// Runner is a configured, not yet running, runner.
type Runner struct {
	srv       *server.Server
	sup       *supervisor.Supervisor
	owners    *api.Owners
	advertise string
	// kube and hub, with the kubernetes executor: its informers run
	// beside the supervisor, and the hub's streams end before the drain.
	kube *executor.Kubernetes
	hub  *hostlink.Hub
	// records, with the local executor and Deps.ProcessDir: closed once
	// the agents have stopped.
	records *executor.ProcessRecords
	// watcher hears the Librarian's decisions, when an agent type asks it.
	watcher *govern.Watcher
	// gateway is the connection to the coven gateway, if there is one.
	gateway *grpc.ClientConn
}

// New checks cfg and builds the runner. The store's Tables and the Queues
// must exist.
func New(cfg Config, deps Deps, opts ...server.Option) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger, tel := deps.Logger, deps.Telemetry
	registry, err := agenttype.Load(cfg.AgentTypesFile)
	if err != nil {
		return nil, fmt.Errorf("CONCLAVE_RUNNER_AGENT_TYPES: %w", err)
	}
	// Which types this runner launches, said once: a launch of one it
	// does not list, or lists as disabled, is refused.
	logger.Info("runner: agent types loaded", "file", cfg.AgentTypesFile, "count", len(registry.List()), "types", registry.Summary())
	serverID := cfg.ServerID
	if serverID == "" {
		if serverID, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("runner server id: %w", err)
		}
	}
	r := &Runner{advertise: cfg.AdvertiseAddr}
	exec := deps.Executor
	// confine checks a launch's workspace_path: a directory on this host,
	// or only a name where the agent gets a throwaway emptyDir.
	confine := func(p string) (string, error) { return executor.ConfineWorkspace(cfg.WorkspaceRoots, p) }
	var hosts *hostLinks
	switch {
	case exec != nil:
	case cfg.Executor == ExecutorKubernetes:
		if r.kube, err = newKubernetes(cfg.KubeConfig, deps.Kube, logger); err != nil {
			return nil, err
		}
		exec = r.kube
		if cfg.WorkspaceClaim == "" {
			confine = func(p string) (string, error) { return executor.ConfineWorkspaceName(cfg.WorkspaceRoots, p) }
		}
		r.hub = hostlink.NewHub([]byte(cfg.HostKey), logger)
		hosts = &hostLinks{hub: r.hub, key: []byte(cfg.HostKey), runnerAddr: r.hostAddr(cfg.HostAddr),
			settings: hostlink.Settings{ProtocolTimeout: cfg.ProtocolTimeout, MaxLine: cfg.MaxLineBytes}, otlp: cfg.HostOTLPEndpoint,
			gatewayAddr: cmp.Or(cfg.HostGatewayAddr, cfg.GatewayAddr), gatewayHeartbeat: cfg.GatewayHeartbeat}
	default:
		local := &executor.Local{Roots: cfg.WorkspaceRoots}
		if deps.ProcessDir != "" {
			// Before any launch runs: what a crashed runner left is ended
			// before its launches are taken over.
			if local.Records, err = executor.OpenProcessRecords(deps.ProcessDir, logger); err != nil {
				logger.Warn("running without agent process records: agents' children may outlive a crash of this runner", "err", err)
			}
			r.records = local.Records
		}
		exec = local
	}
	rec := records.New(deps.Store)
	runnerMetrics := metrics.New(tel.Meter("runner"))
	if r.hub != nil {
		r.hub.SetMetrics(runnerMetrics)
	}
	supOpts := supervisor.Options{
		Records: rec, Queue: deps.Queue, Registry: registry, Executor: exec,
		LaunchQueue: cfg.LaunchQueue, EventsQueue: cfg.EventsQueue,
		Workers: cfg.Workers, Visibility: cfg.LaunchRetry, ProtocolTimeout: cfg.ProtocolTimeout, SilenceTimeout: cfg.SilenceTimeout,
		CancelGrace: cfg.CancelGrace, IdleTimeout: cfg.IdleTimeout, MaxLine: cfg.MaxLineBytes,
		Source: "runner/" + serverID, Logger: logger, Metrics: runnerMetrics,
		TracerProvider: tel.TracerProvider(), BeforeEventSend: deps.BeforeEventSend,
	}
	if hosts != nil {
		supOpts.Hosts, supOpts.HostStartTimeout, supOpts.HostExitGrace = hosts, cfg.HostStartTimeout, cfg.HostExitGrace
		// Agents in Jobs are registered at the gateway by their agent-host,
		// from where they run.
		supOpts.HostGateway = hosts.gatewayAddr != ""
	}
	if gov, watcher, err := newGovernance(cfg, deps, registry, serverID, runnerMetrics); err != nil {
		return nil, err
	} else if gov != nil {
		supOpts.Governor, r.watcher = gov, watcher
	}
	if cfg.GatewayAddr != "" {
		// One connection for every agent's stream; the gateway's load
		// balancer spreads connections, not streams, so the runner's
		// agents share a replica until it goes, then move together.
		r.gateway, err = grpc.NewClient(cfg.GatewayAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			deps.GatewayDialOptions...)...)
		if err != nil {
			return nil, fmt.Errorf("CONCLAVE_RUNNER_GATEWAY_ADDR: %w", err)
		}
		supOpts.Gateway, supOpts.GatewayHost = covenlink.NewRegistrar(r.gateway, cfg.GatewayToken, cfg.GatewayHeartbeat, logger), serverID
	}
	sup := supervisor.New(supOpts)

	grpcOpts := tel.GRPCServerOptions()
	var restAuth *api.RESTAuth
	// Made whether or not tokens are checked, so that every documented
	// metric is on /metrics from the start.
	authThrottled := telemetry.AuthThrottled(tel.Meter("runner"), "runner")
	if !cfg.AllowUnauthenticated {
		throttle := auth.NewThrottle(cfg.AuthThrottle.Options(authThrottled))
		tokens := auth.NewTokens(cfg.ClientTokens...).WithThrottle(throttle)
		restAuth = &api.RESTAuth{Tokens: tokens, Throttle: throttle}
		// Protect covers the API's service only: agent-host's link
		// (AgentHostService) presents its instance's token to the hub.
		unary, stream := tokens.Protect(api.ServicePrefix)
		grpcOpts = append(grpcOpts, grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	} else {
		logger.Warn("the runner's API accepts requests without a bearer token")
	}
	// After authentication, so that only accepted callers spend tokens.
	limitUnary, limitStream := api.NewRateLimiter(cfg.ClientRate, cfg.ClientBurst).Interceptors()
	grpcOpts = append(grpcOpts, grpc.ChainUnaryInterceptor(limitUnary), grpc.ChainStreamInterceptor(limitStream))
	opts = append([]server.Option{
		server.WithGRPCOptions(grpcOpts...),
		server.WithMetricsHandler(tel.MetricsHandler()),
		server.WithHTTPMiddleware(func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "runner") }),
		// The server's own 413s and 500s in the REST error body too.
		server.WithHTTPErrorWriter(api.WriteHTTPError),
	}, opts...)
	if cfg.AllowUnauthenticated {
		opts = append(opts, server.WithDevelopmentGuard(cfg.AllowedHosts))
	}
	srv, err := server.New(server.Config{
		Name: "runner", GRPCAddr: string(cfg.GRPCAddr), HTTPAddr: string(cfg.HTTPAddr),
		ShutdownTimeout: cfg.ShutdownTimeout, MaxRequestBodyBytes: 1 << 20,
	}, logger, opts...)
	if err != nil {
		return nil, fmt.Errorf("runner server: %w", err)
	}
	// Replicas reach each other as the REST self-client reaches this one:
	// without TLS, on the internal network.
	owners := api.NewOwners(cfg.ForwardTimeout, runnerMetrics, logger,
		append(tel.GRPCDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	runnerv1.RegisterRunnerServiceServer(srv.GRPC(), api.New(rec, registry, sup, confine, api.DefaultLimits, owners).WithExecutor(exec.Name()))
	if r.hub != nil {
		r.hub.Register(srv.GRPC())
	}
	if cfg.HTTPAddr != "" {
		selfOpts := tel.GRPCDialOptions()
		if restAuth != nil {
			// Its calls are marked as the front's, which throttles its
			// own callers' addresses: the gRPC side sees only this
			// process's.
			selfOpts = append(selfOpts, restAuth.Throttle.SelfDialOptions()...)
		}
		self, err := srv.SelfClient(selfOpts...)
		if err != nil {
			return nil, err
		}
		rest, err := api.NewREST(context.Background(), self, restAuth)
		if err != nil {
			return nil, err
		}
		rest.Routes(srv.Handle, srv.HandleStream)
	}
	if r.hub != nil {
		// agent-host's streams are ended first (their hosts buffer and
		// redial whichever runner claims the launch), so that the gRPC
		// drain does not wait on them.
		srv.OnShutdown(func(context.Context) { r.hub.Shutdown() })
	}
	r.srv, r.sup, r.owners = srv, sup, owners
	return r, nil
}

// newKubernetes builds the Kubernetes executor, on rc when it is given.
func newKubernetes(cfg executor.KubeConfig, rc *rest.Config, logger *slog.Logger) (*executor.Kubernetes, error) {
	if rc == nil {
		return executor.NewKubernetesFromConfig(cfg, logger)
	}
	client, err := executor.NewKubeClient(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes executor: %w", err)
	}
	return executor.NewKubernetes(cfg, client, logger)
}

// hostAddr is where agent-host dials this replica: set, advertised, or the
// bound listener's address.
func (r *Runner) hostAddr(set string) func() string {
	return func() string {
		switch {
		case set != "":
			return set
		case r.advertise != "":
			return r.advertise
		}
		return server.AdvertisedAddr(r.srv.GRPCAddr())
	}
}

// Run serves and runs launches until ctx is cancelled, then drains: agents
// still running are stopped and their launches left for the next runner.
func (r *Runner) Run(ctx context.Context) error {
	// Either half ending ends the other: a listener that cannot bind must
	// not leave Run waiting on workers that only stop with ctx.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if r.watcher != nil {
		watched := make(chan struct{})
		go func() { defer close(watched); _ = r.watcher.Run(ctx) }()
		defer func() { cancel(); <-watched }()
	}
	errs := make(chan error, 1)
	go func() {
		// Launches are claimed once the address they are claimed under,
		// for other replicas to forward to, is known.
		select {
		case <-r.srv.Ready():
		case <-ctx.Done():
			errs <- nil
			return
		}
		owner := r.advertise
		if owner == "" {
			owner = server.AdvertisedAddr(r.srv.GRPCAddr())
		}
		if r.kube == nil {
			errs <- r.sup.Run(ctx, owner)
			cancel()
			return
		}
		// The informers outlive the supervisor: its launches, stopping,
		// still wait on their Jobs.
		kubeCtx, stopKube := context.WithCancel(context.WithoutCancel(ctx))
		kubeErr := make(chan error, 1)
		go func() { kubeErr <- r.kube.Run(kubeCtx) }()
		err := r.sup.Run(ctx, owner)
		stopKube()
		if kerr := <-kubeErr; err == nil && kerr != nil && !errors.Is(kerr, context.Canceled) {
			err = fmt.Errorf("kubernetes executor: %w", kerr)
		}
		errs <- err
		cancel()
	}()
	err := r.srv.Run(ctx)
	// After the drain: calls still in flight may be forwarding.
	_ = r.owners.Close()
	cancel()
	if serr := <-errs; err == nil {
		err = serr
	}
	if r.records != nil {
		// The supervisor has stopped its agents.
		_ = r.records.Close()
	}
	if r.gateway != nil {
		// Its agents have deregistered.
		_ = r.gateway.Close()
	}
	return err
}

// Ready is closed once the listeners are bound.
func (r *Runner) Ready() <-chan struct{} { return r.srv.Ready() }

// Endpoints lists where the runner listens, once Ready.
func (r *Runner) Endpoints() []server.Endpoint {
	eps := []server.Endpoint{{Service: "runner", Protocol: "gRPC: conclave.runner.v1", Address: r.srv.GRPCAddr()}}
	if addr := r.srv.HTTPAddr(); addr != "" {
		eps = append(eps, server.Endpoint{Service: "runner", Protocol: "HTTP: REST /api/v1/agents, /api/v1/tasks, /api/v1/agent-types; /healthz /readyz /metrics", Address: addr})
	}
	return eps
}
