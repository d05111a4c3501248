// Package service wires the bus into a runnable server. It is the one entry
// point shared by cmd/bus and the all-in-one `conclave dev`.
package service

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
	"github.com/conclave-ai/conclave/services/bus/internal/cluster"
	"github.com/conclave-ai/conclave/services/bus/internal/deadletters"
	"github.com/conclave-ai/conclave/services/bus/internal/wsserve"
)

// Config is the bus's configuration.
type Config struct {
	Addr     config.ListenAddr `env:"CONCLAVE_BUS_ADDR" default:":7892" help:"WebSocket listener (JSON-RPC 2.0 on /), with /healthz /readyz /metrics and /v1/dead-letters"`
	ServerID string            `env:"CONCLAVE_BUS_SERVER_ID" help:"serverId in initialize (default: the host name)"`
	TLSCert  string            `env:"CONCLAVE_BUS_TLS_CERT" help:"PEM certificate file; with CONCLAVE_BUS_TLS_KEY the listener serves wss://"`
	TLSKey   string            `env:"CONCLAVE_BUS_TLS_KEY" help:"PEM private key file of CONCLAVE_BUS_TLS_CERT"`
	Grants   string            `env:"CONCLAVE_BUS_GRANTS" help:"JSON array of grants: [{\"token\":..., \"client_id\":..., \"publish\":[patterns], \"subscribe\":[patterns], \"default_topic\":..., \"admin\":bool}]; {client_id} in a pattern is the client's id"`
	// AllowUnauthenticated opens the bus to every client with every
	// permission; conclave dev sets it, on loopback only.
	AllowUnauthenticated bool          `env:"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED" default:"false" help:"serve clients without bearer tokens, all allowed (development only)"`
	Policy               string        `env:"CONCLAVE_BUS_POLICY" default:"stopPropagationOnProcessed" help:"bus-wide propagation policy: stopPropagationOnProcessed, stopPropagationOnStop or continueAll"`
	ClientPolicies       bool          `env:"CONCLAVE_BUS_CLIENT_POLICIES" default:"true" help:"let a subscribe's suggested policy override the bus-wide one"`
	DeliveryTimeout      time.Duration `env:"CONCLAVE_BUS_DELIVERY_TIMEOUT" default:"30s" validate:"positive" help:"how long a subscriber may take to answer a delivery"`
	MaxFrameBytes        int           `env:"CONCLAVE_BUS_MAX_FRAME_BYTES" default:"1048576" validate:"positive" help:"largest WebSocket message accepted; a larger one closes the connection with 1009"`
	OutboundBuffer       int           `env:"CONCLAVE_BUS_OUTBOUND_BUFFER" default:"256" validate:"positive" help:"frames that may wait for a slow client before it is disconnected (1008)"`
	WriteTimeout         time.Duration `env:"CONCLAVE_BUS_WRITE_TIMEOUT" default:"10s" validate:"positive" help:"how long one frame may take to write before the client is disconnected as a slow reader"`
	MaxSubscriptions     int           `env:"CONCLAVE_BUS_MAX_SUBSCRIPTIONS" default:"100" validate:"positive" help:"subscriptions one client may hold"`
	MaxInflight          int           `env:"CONCLAVE_BUS_MAX_INFLIGHT" default:"64" validate:"positive" help:"requests of one client handled at once; past that its connection stops being read"`
	Rate                 float64       `env:"CONCLAVE_BUS_RATE" default:"200" validate:"positive" help:"requests per second one client may make"`
	Burst                int           `env:"CONCLAVE_BUS_BURST" default:"400" validate:"positive" help:"requests one client may make at once above its rate"`
	RetryAttempts        int           `env:"CONCLAVE_BUS_RETRY_ATTEMPTS" default:"3" validate:"positive" help:"deliveries of a message to an agent, the first included, before it is dead-lettered"`
	RetryBaseDelay       time.Duration `env:"CONCLAVE_BUS_RETRY_BASE_DELAY" default:"1s" validate:"positive" help:"first retry delay when the agent gives no retry_seconds; doubles per attempt"`
	RetryMaxDelay        time.Duration `env:"CONCLAVE_BUS_RETRY_MAX_DELAY" default:"5m" validate:"positive" help:"cap on every retry delay, retry_seconds included (at most 15m)"`
	Workspace            string        `env:"CONCLAVE_BUS_WORKSPACE" help:"BUB_WORKSPACE of agents the default handler launches"`
	PublicURL            string        `env:"CONCLAVE_BUS_PUBLIC_URL" help:"BUB_BUS_URL given to launched agents (default: ws:// or wss:// and the listener's address)"`
	RunnerAddr           string        `env:"CONCLAVE_BUS_RUNNER_ADDR" help:"host:port of the runner's gRPC API (conclave.runner.v1) the default handler launches agents through; unset, a message no subscriber matches is answered with success false"`
	RunnerToken          string        `env:"CONCLAVE_BUS_RUNNER_TOKEN" help:"bearer token the bus presents to the runner (one of its CONCLAVE_RUNNER_CLIENT_TOKENS)"`
	RunnerAgentType      string        `env:"CONCLAVE_BUS_RUNNER_AGENT_TYPE" help:"agent_type the default handler launches (one of the runner's agent types); required with CONCLAVE_BUS_RUNNER_ADDR"`
	RunnerTLS            bool          `env:"CONCLAVE_BUS_RUNNER_TLS" default:"false" help:"dial the runner with TLS (the system's roots)"`
	SpawnTimeout         time.Duration `env:"CONCLAVE_BUS_SPAWN_TIMEOUT" default:"60s" validate:"positive" help:"how long the default handler waits for a launched agent to subscribe"`
	AgentReplyTopics     []string      `env:"CONCLAVE_BUS_AGENT_REPLY_TOPICS" help:"comma-separated LAUNCH_PATTERN=TEMPLATE rules: an agent the default handler launched for a topic the pattern matches may also publish on the template, {topic} being its topic and {topic_id} what follows its first ':' (tg:*=outbound:{topic_id} lets the agent of tg:42 reply on outbound:42)"`
	AgentTokenTTL        time.Duration `env:"CONCLAVE_BUS_AGENT_TOKEN_TTL" default:"24h" validate:"positive" help:"how long the token (BUB_TOKEN) of an agent the default handler launched stays valid, and the agent is known as the agent of its topic"`
	PeerToken            string        `env:"CONCLAVE_BUS_PEER_TOKEN" help:"shared secret of the replicas; when set, each replica forwards messages to the others (listed in the store) and accepts theirs on /internal/v1/deliver"`
	AdvertiseAddr        string        `env:"CONCLAVE_BUS_ADVERTISE_ADDR" help:"host:port other replicas reach this one at (default: the listener's address)"`
	Lease                time.Duration `env:"CONCLAVE_BUS_LEASE" default:"15s" validate:"positive" help:"how long a replica stays listed after its last renewal"`
	ShutdownTimeout      time.Duration `env:"CONCLAVE_BUS_SHUTDOWN_TIMEOUT" default:"15s" validate:"positive" help:"how long in-flight work may drain on shutdown"`
	// AllowedHosts are answered besides loopback names while the bus runs
	// without authentication.
	AllowedHosts []string `env:"CONCLAVE_BUS_ALLOWED_HOSTS" help:"comma-separated Host names the listener answers besides localhost, 127.0.0.1 and [::1] while it runs without authentication"`
	// AuthThrottle is the per-address budget of wrong tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_BUS_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`
}

// Validate implements config.Validator.
func (c Config) Validate() error {
	if err := config.Check(c); err != nil {
		return err
	}
	if c.Addr == "" {
		return errors.New("CONCLAVE_BUS_ADDR: the bus needs a listener")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("CONCLAVE_BUS_TLS_CERT, CONCLAVE_BUS_TLS_KEY: set both or neither")
	}
	access, err := broker.ParseGrants(c.Grants)
	if err != nil {
		return fmt.Errorf("CONCLAVE_BUS_GRANTS: %w", err)
	}
	if access.Len() == 0 && !c.AllowUnauthenticated {
		return errors.New("CONCLAVE_BUS_GRANTS: set at least one grant, or CONCLAVE_BUS_ALLOW_UNAUTHENTICATED=true for development")
	}
	if c.AllowUnauthenticated {
		if err := httpguard.CheckListen("CONCLAVE_BUS_ADDR", string(c.Addr), "CONCLAVE_BUS_ALLOW_UNAUTHENTICATED"); err != nil {
			return err
		}
	}
	if _, err := broker.ParseReplyRules(c.AgentReplyTopics); err != nil {
		return fmt.Errorf("CONCLAVE_BUS_AGENT_REPLY_TOPICS: %w", err)
	}
	if _, err := broker.ParsePolicy(c.Policy); err != nil {
		return fmt.Errorf("CONCLAVE_BUS_POLICY: %w", err)
	}
	if c.RunnerAddr != "" {
		if _, _, err := net.SplitHostPort(c.RunnerAddr); err != nil {
			return fmt.Errorf("CONCLAVE_BUS_RUNNER_ADDR: %q is not host:port: %w", c.RunnerAddr, err)
		}
		if c.RunnerAgentType == "" {
			return errors.New("CONCLAVE_BUS_RUNNER_AGENT_TYPE: set the agent type the default handler launches through CONCLAVE_BUS_RUNNER_ADDR")
		}
		if c.Workspace == "" {
			return errors.New("CONCLAVE_BUS_WORKSPACE: the runner needs the absolute workspace path of the agents the default handler launches")
		}
	}
	if c.PeerToken != "" {
		if err := auth.CheckTokens("CONCLAVE_BUS_PEER_TOKEN", c.PeerToken); err != nil {
			return err
		}
	}
	if c.RunnerToken != "" {
		// The runner refuses a shorter one; better to say so here.
		if err := auth.CheckTokens("CONCLAVE_BUS_RUNNER_TOKEN", c.RunnerToken); err != nil {
			return err
		}
	}
	if c.RetryMaxDelay > queue.MaxDelay {
		return fmt.Errorf("CONCLAVE_BUS_RETRY_MAX_DELAY: at most %s (the longest queue delay), got %s", queue.MaxDelay, c.RetryMaxDelay)
	}
	return nil
}

// Tables lists the tables the bus keeps its state in.
var Tables = []store.Table{broker.DeadLetterTable, ReplicaTable, broker.LaunchTable}

// ReplicaTable lists the live replicas (internal/cluster).
var ReplicaTable = cluster.Table

// Queues lists the queues the bus owns. Every service declares its queues
// this way, as a function of its config, whether or not their names
// depend on it (the runner's do).
func Queues(Config) []queue.Definition {
	return []queue.Definition{broker.RetryQueue, broker.EventsQueue}
}

// Launcher starts agents for the default handler (the runner's launch API).
type Launcher = broker.Launcher

// LaunchRequest is what a Launcher is asked for.
type LaunchRequest = broker.LaunchRequest

// Bus is a configured, not yet running, bus.
type Bus struct {
	srv     *server.Server
	broker  *broker.Broker
	retries *broker.Retries
	events  *broker.Events
	cluster *cluster.Cluster
	cfg     Config
	tls     bool
}

// Deps are what the bus runs on.
type Deps struct {
	// Store holds dead letters, launched agents' tokens and the replicas;
	// Queue the retries and events. Tables and Queues must exist.
	Store     store.Store
	Queue     queue.Queue
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
	// Launcher, when set, is what the default handler launches agents
	// through; without it a message no subscriber matches is answered
	// with success false.
	Launcher Launcher
}

// New checks cfg and builds the bus.
func New(cfg Config, deps Deps, opts ...server.Option) (*Bus, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger, tel, st, q, launcher := deps.Logger, deps.Telemetry, deps.Store, deps.Queue, deps.Launcher
	access, _ := broker.ParseGrants(cfg.Grants) // checked by Validate
	policy, _ := broker.ParsePolicy(cfg.Policy)
	serverID := cfg.ServerID
	if serverID == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("bus server id: %w", err)
		}
		serverID = host
	}
	metrics, err := broker.NewMetrics(tel.Meter("bus"))
	if err != nil {
		return nil, fmt.Errorf("bus metrics: %w", err)
	}
	// throttle counts wrong tokens per address, the peers' included.
	throttle := auth.NewThrottle(cfg.AuthThrottle.Options(telemetry.AuthThrottled(tel.Meter("bus"), "bus")))
	b := &Bus{cfg: cfg, tls: cfg.TLSCert != ""}
	b.retries = broker.NewRetries(q, st, broker.RetryPolicy{MaxAttempts: cfg.RetryAttempts,
		BaseDelay: cfg.RetryBaseDelay, MaxDelay: cfg.RetryMaxDelay}, tel.TracerProvider(), logger)
	var forwarder broker.Forwarder
	if cfg.PeerToken != "" {
		scheme := "http"
		if b.tls {
			scheme = "https"
		}
		b.cluster = cluster.New(cluster.Options{Store: st, ServerID: serverID, Token: cfg.PeerToken, Scheme: scheme,
			Lease: cfg.Lease, Logger: logger, Throttle: throttle,
			Client: &http.Client{Transport: tel.HTTPTransport(http.DefaultTransport), Timeout: cfg.DeliveryTimeout + 10*time.Second},
			Addr: func() string {
				if cfg.AdvertiseAddr != "" {
					return cfg.AdvertiseAddr
				}
				return b.srv.HTTPAddr()
			}})
		forwarder = b.cluster
	}
	var dh *broker.DefaultHandler
	if launcher != nil {
		replyRules, err := broker.ParseReplyRules(cfg.AgentReplyTopics)
		if err != nil {
			return nil, fmt.Errorf("CONCLAVE_BUS_AGENT_REPLY_TOPICS: %w", err)
		}
		o := broker.DefaultHandlerOptions{Launcher: launcher, Store: st, Workspace: cfg.Workspace, BusURL: b.URL,
			SpawnTimeout: cfg.SpawnTimeout, TokenTTL: cfg.AgentTokenTTL, ReplyTopics: replyRules, ServerID: serverID, Logger: logger}
		if b.cluster != nil {
			o.Notifier = b.cluster
		}
		dh = broker.NewDefaultHandler(o)
	}
	b.broker = broker.New(broker.Options{
		ServerID: serverID, Version: "0.1.0", DefaultPolicy: policy, ClientPolicies: cfg.ClientPolicies,
		DeliveryTimeout: cfg.DeliveryTimeout, MaxSubscriptions: cfg.MaxSubscriptions,
		Rate: cfg.Rate, Burst: cfg.Burst, Retries: b.retries, DefaultHandler: dh, Forwarder: forwarder,
		Metrics: metrics, Tracer: tel.TracerProvider().Tracer("github.com/conclave-ai/conclave/services/bus"),
		Logger: logger,
	})
	b.events = broker.NewEvents(q, b.broker, tel.TracerProvider(), logger)
	if cfg.AllowUnauthenticated {
		logger.Warn("the bus accepts clients without a bearer token, with every permission")
	}

	if b.tls {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("CONCLAVE_BUS_TLS_CERT: %w", err)
		}
		l, err := net.Listen("tcp", string(cfg.Addr))
		if err != nil {
			return nil, fmt.Errorf("bus listener: %w", err)
		}
		opts = append(opts, server.WithHTTPListener(tls.NewListener(l, &tls.Config{
			Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}
	opts = append([]server.Option{
		server.WithMetricsHandler(tel.MetricsHandler()),
		server.WithHTTPMiddleware(func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "bus") }),
	}, opts...)
	if cfg.AllowUnauthenticated {
		opts = append(opts, server.WithDevelopmentGuard(cfg.AllowedHosts))
	}
	srv, err := server.New(server.Config{Name: "bus", HTTPAddr: string(cfg.Addr), ShutdownTimeout: cfg.ShutdownTimeout}, logger, opts...)
	if err != nil {
		return nil, fmt.Errorf("bus server: %w", err)
	}
	clients := &wsserve.Auth{Open: cfg.AllowUnauthenticated, Access: access, Broker: b.broker, Throttle: throttle, Logger: logger}
	ws := wsserve.NewHandler(clients, b.broker, wsserve.Limits{MaxFrameBytes: cfg.MaxFrameBytes,
		OutboundBuffer: cfg.OutboundBuffer, WriteTimeout: cfg.WriteTimeout, MaxInflight: cfg.MaxInflight}, logger)
	srv.HandleStream("GET /{$}", ws)
	srv.OnShutdown(ws.CloseConnections)
	deadletters.New(b.retries, logger).Routes(srv.Handle, clients.Admin)
	if b.cluster != nil {
		b.cluster.Attach(b.broker)
		b.cluster.Routes(srv.Handle, srv.HandleStream)
	}
	b.srv = srv
	return b, nil
}

// Run serves until ctx is cancelled, then drains.
func (b *Bus) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return b.srv.Run(gctx) })
	g.Go(func() error { return b.retries.Run(gctx) })
	g.Go(func() error { return b.events.Run(gctx) })
	if b.cluster != nil {
		g.Go(func() error {
			select {
			case <-b.srv.Ready():
				b.cluster.Advertise(gctx)
			case <-gctx.Done():
			}
			return nil
		})
	}
	return g.Wait()
}

// Ready is closed once the listener is bound.
func (b *Bus) Ready() <-chan struct{} { return b.srv.Ready() }

// URL is the bus's WebSocket URL, once Ready.
func (b *Bus) URL() string {
	if b.cfg.PublicURL != "" {
		return b.cfg.PublicURL
	}
	scheme := "ws://"
	if b.tls {
		scheme = "wss://"
	}
	return scheme + b.srv.HTTPAddr()
}

// Endpoints lists where the bus listens, once Ready.
func (b *Bus) Endpoints() []server.Endpoint {
	return []server.Endpoint{{Service: "bus", Protocol: "WebSocket JSON-RPC 2.0 (" + b.URL() + "); HTTP /v1/dead-letters /healthz /readyz /metrics", Address: b.srv.HTTPAddr()}}
}
