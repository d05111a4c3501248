// Package service wires the coven gateway into a runnable server. It is the
// one entry point shared by cmd/gateway and the all-in-one `conclave dev`.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/a2a"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
	"github.com/conclave-ai/conclave/services/gateway/internal/clientapi"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
	"github.com/conclave-ai/conclave/services/gateway/internal/registry"
)

// Config is the gateway's configuration.
type Config struct {
	GRPCAddr        config.ListenAddr `env:"CONCLAVE_GATEWAY_GRPC_ADDR" default:":50051" help:"gRPC listener for agents (coven.CovenControl) and clients"`
	HTTPAddr        config.ListenAddr `env:"CONCLAVE_GATEWAY_HTTP_ADDR" default:":8080" help:"HTTP listener: REST, health and metrics"`
	ServerID        string            `env:"CONCLAVE_GATEWAY_SERVER_ID" help:"this replica's name in Welcome (default: the host name)"`
	RegisterTimeout time.Duration     `env:"CONCLAVE_GATEWAY_REGISTER_TIMEOUT" default:"10s" validate:"positive" help:"how long a new stream may wait before RegisterAgent"`
	AgentTimeout    time.Duration     `env:"CONCLAVE_GATEWAY_AGENT_TIMEOUT" default:"0s" help:"how long a registered agent may stay silent before it is deregistered; 0 (the default) keeps a silent agent while its connection lives, since coven heartbeats are optional"`
	// KeepaliveTime and KeepaliveTimeout find dead agents through the
	// transport: a connection silent for KeepaliveTime is pinged (HTTP/2
	// PING, and TCP keepalive probes), and closed when no answer comes
	// within KeepaliveTimeout; its agents are then deregistered.
	KeepaliveTime    time.Duration `env:"CONCLAVE_GATEWAY_KEEPALIVE_TIME" default:"30s" validate:"positive" help:"how long a connection may be silent before the gateway pings it (gRPC keepalive, TCP keepalive)"`
	KeepaliveTimeout time.Duration `env:"CONCLAVE_GATEWAY_KEEPALIVE_TIMEOUT" default:"20s" validate:"positive" help:"how long the gateway waits for a ping's answer before it closes the connection and deregisters its agents"`
	ShutdownTimeout  time.Duration `env:"CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT" default:"15s" validate:"positive" help:"how long in-flight work may drain on shutdown"`
	QueueDepth       int           `env:"CONCLAVE_GATEWAY_QUEUE_DEPTH" default:"32" help:"requests that may wait for a busy agent before callers get RESOURCE_EXHAUSTED"`
	CancelGrace      time.Duration `env:"CONCLAVE_GATEWAY_CANCEL_GRACE" default:"30s" validate:"positive" help:"how long an agent may take to end an abandoned request"`
	Lease            time.Duration `env:"CONCLAVE_GATEWAY_LEASE" default:"15s" validate:"positive" help:"how long a replica's lease (and so its agents' registrations) outlives its last renewal in the store"`
	AdvertiseAddr    string        `env:"CONCLAVE_GATEWAY_ADVERTISE_ADDR" help:"host:port other replicas reach this one's gRPC listener at (default: the listener's address, or the host name and port)"`
	ClientTokens     []string      `env:"CONCLAVE_GATEWAY_CLIENT_TOKENS" help:"comma-separated bearer tokens accepted on the client API"`
	ClientRate       float64       `env:"CONCLAVE_GATEWAY_CLIENT_RATE" default:"50" help:"client API requests per second each client (bearer token) may make on one replica"`
	ClientBurst      int           `env:"CONCLAVE_GATEWAY_CLIENT_BURST" default:"100" validate:"positive" help:"client API requests each client may make at once, above its rate"`
	ClientStreams    int           `env:"CONCLAVE_GATEWAY_CLIENT_STREAMS" default:"64" validate:"positive" help:"streams (SendMessage, WatchThread) each client may hold open on one replica"`
	IdempotencyTTL   time.Duration `env:"CONCLAVE_GATEWAY_IDEMPOTENCY_TTL" default:"24h" validate:"positive" help:"how long a SendMessage idempotency_key is remembered"`
	// History keeps every conversation per thread_id (docs/gateway-clients.md,
	// "Threads and history"); its privacy consequences are there too.
	History      bool          `env:"CONCLAVE_GATEWAY_HISTORY" default:"true" help:"keep every conversation per thread_id in the store; false keeps none (and a repeated idempotency_key is refused rather than replayed)"`
	HistoryTTL   time.Duration `env:"CONCLAVE_GATEWAY_HISTORY_TTL" default:"720h" help:"how long each stored message and event is kept after it was written (DynamoDB TTL; swept on the embedded store); 0 keeps them until deleted by hand"`
	HistoryFlush time.Duration `env:"CONCLAVE_GATEWAY_HISTORY_FLUSH" default:"1s" validate:"positive" help:"how long an answer's events may wait in memory before they are written (they are also written every 64 KiB, and at the answer's end before the client is told it ended)"`
	// DetachedTimeout bounds a request no client follows any more: with
	// history, a client that leaves does not cancel its request, so that
	// it can come back for the rest.
	DetachedTimeout time.Duration `env:"CONCLAVE_GATEWAY_DETACHED_TIMEOUT" default:"10m" validate:"positive" help:"with history, how long a request goes on after its last client left before it is cancelled"`
	AdminTokens     []string      `env:"CONCLAVE_GATEWAY_ADMIN_TOKENS" help:"comma-separated bearer tokens accepted on the client API that may also read every client's threads"`
	// AllowUnauthenticated opens the client API without tokens; conclave dev
	// sets it, on loopback only.
	AllowUnauthenticated bool     `env:"CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED" default:"false" help:"serve the client API without bearer tokens (development only)"`
	AgentTokens          []string `env:"CONCLAVE_GATEWAY_AGENT_TOKENS" help:"comma-separated agent_id=token pairs; an agent sends its token as authorization: Bearer metadata on AgentStream"`
	// AllowAgentsWithoutTokens lets agents without a configured token
	// register; agents listed in AgentTokens must still present theirs.
	AllowAgentsWithoutTokens bool `env:"CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS" default:"false" help:"let agents with no token in CONCLAVE_GATEWAY_AGENT_TOKENS register (development only)"`
	MaxHeartbeats            int  `env:"CONCLAVE_GATEWAY_MAX_HEARTBEATS" default:"50" validate:"positive" help:"heartbeats an agent may send in one second before its stream is closed"`
	// AllowedHosts are answered besides loopback names while the gateway
	// runs without authentication.
	AllowedHosts []string `env:"CONCLAVE_GATEWAY_ALLOWED_HOSTS" help:"comma-separated Host names the HTTP listener answers besides localhost, 127.0.0.1 and [::1] while it runs without authentication"`
	// AuthThrottle is the per-address budget of wrong tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_GATEWAY_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`
	// PublicURL is where A2A clients reach the gateway's HTTP listener,
	// through whatever load balancer is in front: the agent cards name it.
	PublicURL string `env:"CONCLAVE_GATEWAY_PUBLIC_URL" help:"the gateway's HTTP URL as A2A clients reach it (e.g. https://agents.example.com), named in agent cards; default: the request's Host"`
}

// unauthenticated reports whether a listener of the gateway runs without
// authentication: it must then bind loopback only.
func (c Config) unauthenticated() bool { return c.AllowUnauthenticated || c.AllowAgentsWithoutTokens }

// Validate implements config.Validator.
func (c Config) Validate() error {
	if err := config.Check(c); err != nil {
		return err
	}
	if c.GRPCAddr == "" {
		return fmt.Errorf("CONCLAVE_GATEWAY_GRPC_ADDR: the gateway needs a gRPC listener")
	}
	if len(c.ClientTokens)+len(c.AdminTokens) == 0 && !c.AllowUnauthenticated {
		return fmt.Errorf("CONCLAVE_GATEWAY_CLIENT_TOKENS: set at least one client token, or CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED=true for development")
	}
	if err := auth.CheckTokens("CONCLAVE_GATEWAY_CLIENT_TOKENS", c.ClientTokens...); err != nil {
		return err
	}
	if err := auth.CheckTokens("CONCLAVE_GATEWAY_ADMIN_TOKENS", c.AdminTokens...); err != nil {
		return err
	}
	if len(c.AdminTokens) > 0 && c.AllowUnauthenticated {
		// Every caller is the one anonymous client then: no token is
		// checked, so none can make its holder an admin.
		return fmt.Errorf("CONCLAVE_GATEWAY_ADMIN_TOKENS: tokens are not checked while CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED=true; set one or the other")
	}
	if c.PublicURL != "" {
		u, err := url.Parse(c.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			// The value is not echoed: it may hold credentials.
			return fmt.Errorf("CONCLAVE_GATEWAY_PUBLIC_URL: must be an http or https URL with a host and nothing else (no path, query or credentials)")
		}
	}
	if c.HistoryTTL < 0 {
		return fmt.Errorf("CONCLAVE_GATEWAY_HISTORY_TTL: must be 0 (kept until deleted) or positive, got %s", c.HistoryTTL)
	}
	if c.unauthenticated() {
		allowing := "CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED"
		if !c.AllowUnauthenticated {
			allowing = "CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS"
		}
		if err := httpguard.CheckListen("CONCLAVE_GATEWAY_GRPC_ADDR", string(c.GRPCAddr), allowing); err != nil {
			return err
		}
		if err := httpguard.CheckListen("CONCLAVE_GATEWAY_HTTP_ADDR", string(c.HTTPAddr), allowing); err != nil {
			return err
		}
	}
	if _, err := auth.ParseAgentTokens(c.AgentTokens, !c.AllowAgentsWithoutTokens); err != nil {
		return fmt.Errorf("CONCLAVE_GATEWAY_AGENT_TOKENS: %w", err)
	}
	if len(c.AgentTokens) == 0 && !c.AllowAgentsWithoutTokens {
		return fmt.Errorf("CONCLAVE_GATEWAY_AGENT_TOKENS: set a token for each agent, or CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS=true for development")
	}
	if !(c.ClientRate > 0) || math.IsInf(c.ClientRate, 0) {
		return fmt.Errorf("CONCLAVE_GATEWAY_CLIENT_RATE: must be a positive number, got %g", c.ClientRate)
	}
	if c.QueueDepth < 1 || c.QueueDepth > 10000 {
		return fmt.Errorf("CONCLAVE_GATEWAY_QUEUE_DEPTH: must be 1..10000, got %d", c.QueueDepth)
	}
	if c.AgentTimeout < 0 {
		return fmt.Errorf("CONCLAVE_GATEWAY_AGENT_TIMEOUT: must be 0 (off) or positive, got %s", c.AgentTimeout)
	}
	return nil
}

// Gateway is a configured, not yet running, gateway.
type Gateway struct {
	srv      *server.Server
	agents   *agentstream.Service
	replica  *registry.Replica
	serverID string
	cfg      Config
	log      *slog.Logger
}

// Tables lists the tables the gateway keeps its state in.
var Tables = []store.Table{registry.Table, clientapi.IdempotencyTable, history.Table, a2a.TasksTable}

// Deps are what the gateway runs on.
type Deps struct {
	// Store holds the cluster-wide agent registry, idempotency keys and
	// history; its Tables must exist.
	Store     store.Store
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
}

// New checks cfg and builds the gateway's server and services.
func New(cfg Config, deps Deps, opts ...server.Option) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger, tel, st := deps.Logger, deps.Telemetry, deps.Store
	serverID := cfg.ServerID
	if serverID == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("gateway server id: %w", err)
		}
		serverID = host
	}
	m := metrics.New(tel.Meter("gateway"), serverID)
	// An agent's stream lives as long as its connection: one span for it
	// would tell nothing and hold memory for every idle agent.
	grpcOpts := append(tel.GRPCServerOptions(covenpb.CovenControl_AgentStream_FullMethodName), agentstream.ServerOption())
	// One budget of wrong tokens per address, clients' and agents' alike.
	throttle := auth.NewThrottle(cfg.AuthThrottle.Options(telemetry.AuthThrottled(tel.Meter("gateway"), "gateway")))
	// Authentication, then the per-client limits: every GatewayService
	// call passes them, over gRPC and over REST alike.
	var ic clientapi.Interceptors
	if !cfg.AllowUnauthenticated {
		tokens := auth.NewTokens(slices.Concat(cfg.ClientTokens, cfg.AdminTokens)...).WithThrottle(throttle)
		unary, stream := tokens.Protect(clientapi.ServicePrefix)
		ic.Unary, ic.Stream = append(ic.Unary, unary), append(ic.Stream, stream)
	} else {
		logger.Warn("the gateway's client API accepts requests without a bearer token")
	}
	// After authentication, so that only accepted callers spend tokens, each
	// from its own bucket.
	limitUnary, limitStream := clientapi.NewLimiter(clientapi.RateLimits{
		Rate: cfg.ClientRate, Burst: cfg.ClientBurst, Streams: cfg.ClientStreams,
	}).Interceptors(m)
	ic.Unary, ic.Stream = append(ic.Unary, limitUnary), append(ic.Stream, limitStream)
	grpcOpts = append(grpcOpts, grpc.ChainUnaryInterceptor(ic.Unary...), grpc.ChainStreamInterceptor(ic.Stream...))
	opts = append([]server.Option{
		// Every HTTP error, the server's own included, is a
		// google.rpc.Status, as grpc-gateway writes REST errors.
		server.WithHTTPErrorWriter(clientapi.WriteHTTPError),
		server.WithGRPCOptions(grpcOpts...),
		server.WithMetricsHandler(tel.MetricsHandler()),
		server.WithHTTPMiddleware(func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "gateway") }),
	}, opts...)
	if cfg.unauthenticated() {
		opts = append(opts, server.WithDevelopmentGuard(cfg.AllowedHosts))
	}
	srv, err := server.New(server.Config{
		Name:            "gateway",
		GRPCAddr:        string(cfg.GRPCAddr),
		HTTPAddr:        string(cfg.HTTPAddr),
		ShutdownTimeout: cfg.ShutdownTimeout,
		// Attachments of up to 3 MiB arrive base64-encoded in REST bodies.
		MaxRequestBodyBytes: 5 << 20,
		Keepalive:           server.Keepalive{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout},
	}, logger, opts...)
	if err != nil {
		return nil, fmt.Errorf("gateway server: %w", err)
	}
	agentTokens, err := auth.ParseAgentTokens(cfg.AgentTokens, !cfg.AllowAgentsWithoutTokens)
	if err != nil {
		return nil, fmt.Errorf("CONCLAVE_GATEWAY_AGENT_TOKENS: %w", err)
	}
	agentTokens.WithThrottle(throttle)
	if cfg.AllowAgentsWithoutTokens {
		logger.Warn("agents without a configured token may register", "agents_with_tokens", agentTokens.Len())
	}
	reg := registry.New(st)
	var agents *agentstream.Service
	replica := reg.Replica(serverID, registry.ReplicaOptions{
		Lease:    cfg.Lease,
		Holdings: func() []*gatewayv1.Agent { return agents.Holdings() },
		Lost:     func(agentID, instanceID string, reason error) { agents.Lost(agentID, instanceID, reason) },
		Logger:   logger,
		Observe:  m.Lease,
	})
	agents = agentstream.New(agentstream.Options{
		Authenticate:    agentTokens.Check,
		MaxHeartbeats:   cfg.MaxHeartbeats,
		ServerID:        serverID,
		InstancePrefix:  serverID + "-" + replica.Boot(),
		RegisterTimeout: cfg.RegisterTimeout,
		AgentTimeout:    cfg.AgentTimeout,
		QueueDepth:      cfg.QueueDepth,
		CancelGrace:     cfg.CancelGrace,
		Registry:        replica,
		Metrics:         m,
	}, logger)
	// A replica that cannot renew its lease takes no new agents; the load
	// balancer should send them elsewhere meanwhile. Those it holds stay.
	srv.AddReadinessCheck("lease", func(context.Context) error { return replica.Healthy() })
	covenpb.RegisterCovenControlServer(srv.GRPC(), agents)
	peers := clientapi.NewPeers(serverID, tel.GRPCDialOptions()...)
	apiOpts := []clientapi.Option{clientapi.WithIdempotency(st, cfg.IdempotencyTTL), clientapi.WithLogger(logger), clientapi.WithMetrics(m)}
	admins := make([]string, 0, len(cfg.AdminTokens))
	for _, t := range cfg.AdminTokens {
		admins = append(admins, auth.TokenID(t))
	}
	var hist *history.Store
	if cfg.History {
		hist = history.New(st, history.Options{TTL: cfg.HistoryTTL, FlushInterval: cfg.HistoryFlush, Logger: logger, Observe: m.HistoryWrite})
		apiOpts = append(apiOpts, clientapi.WithHistory(hist, cfg.DetachedTimeout), clientapi.WithAdmins(admins...))
	}
	api := clientapi.New(agents, clientapi.DefaultLimits, serverID, reg, peers, apiOpts...)
	gatewayv1.RegisterGatewayServiceServer(srv.GRPC(), api)
	srv.OnShutdown(func(context.Context) { _ = peers.Close() })

	if cfg.HTTPAddr != "" {
		// REST calls the service in this process, through the same
		// interceptors as gRPC; the HTTP server traces it.
		rest, err := clientapi.NewREST(api, ic, logger)
		if err != nil {
			return nil, err
		}
		rest.Routes(srv.Handle, srv.HandleStream)
		// Every agent is an A2A agent too, over the same API and limits.
		a2a.New(api, ic, st, a2a.Options{
			PublicURL: cfg.PublicURL, Secured: !cfg.AllowUnauthenticated, Admins: admins,
			History: hist, TaskTTL: cfg.HistoryTTL, Logger: logger, Metrics: m,
		}).Routes(srv.Handle, srv.HandleStream)
	}
	srv.OnShutdown(func(ctx context.Context) {
		// The lease goes first: its agents' registrations are then free at
		// once, for them to reconnect through another replica as soon as
		// they are told to, and their disconnections cost no store writes.
		if err := replica.Withdraw(ctx); err != nil {
			logger.WarnContext(ctx, "could not give up this replica's lease; its agents are free when it expires", "error", err)
		}
		agents.Shutdown(ctx, "gateway "+serverID+" is shutting down")
		// The requests the agents were answering have ended; their ends
		// are written before the store closes.
		api.Drain(ctx)
	})
	return &Gateway{srv: srv, agents: agents, replica: replica, serverID: serverID, cfg: cfg, log: logger}, nil
}

// Run serves until ctx is cancelled, then drains. While it serves, it keeps
// this replica's lease, which holds its agents' registrations and its
// address for the others to forward to.
func (g *Gateway) Run(ctx context.Context) error {
	leasing, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-g.srv.Ready():
		case <-leasing.Done():
			return
		}
		addr := g.cfg.AdvertiseAddr
		if addr == "" {
			addr = server.AdvertisedAddr(g.srv.GRPCAddr())
		}
		g.replica.Run(leasing, addr)
	}()
	return g.srv.Run(ctx)
}

// Ready is closed once the listeners are bound.
func (g *Gateway) Ready() <-chan struct{} { return g.srv.Ready() }

// Endpoints lists where the gateway listens, once Ready.
func (g *Gateway) Endpoints() []server.Endpoint {
	eps := []server.Endpoint{{Service: "gateway", Protocol: "gRPC: coven.CovenControl (agents), conclave.gateway.v1 (clients)", Address: g.srv.GRPCAddr()}}
	if addr := g.srv.HTTPAddr(); addr != "" {
		eps = append(eps, server.Endpoint{Service: "gateway", Protocol: "HTTP: REST /v1/agents (SSE), A2A /a2a/{agent_id}, /healthz /readyz /metrics", Address: addr})
	}
	return eps
}
