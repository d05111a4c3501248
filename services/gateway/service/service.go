// Package service wires the coven gateway into a runnable server. It is the
// one entry point shared by cmd/gateway and the all-in-one `conclave dev`.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
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
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
	"github.com/conclave-ai/conclave/services/gateway/internal/clientapi"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
	"github.com/conclave-ai/conclave/services/gateway/internal/registry"
)

// Config is the gateway's configuration.
type Config struct {
	GRPCAddr        config.ListenAddr `env:"CONCLAVE_GATEWAY_GRPC_ADDR" default:":50051" help:"gRPC listener for agents (coven.CovenControl) and clients"`
	HTTPAddr        config.ListenAddr `env:"CONCLAVE_GATEWAY_HTTP_ADDR" default:":8080" help:"HTTP listener: REST, health and metrics"`
	ServerID        string            `env:"CONCLAVE_GATEWAY_SERVER_ID" help:"this replica's name in Welcome (default: the host name)"`
	RegisterTimeout time.Duration     `env:"CONCLAVE_GATEWAY_REGISTER_TIMEOUT" default:"10s" help:"how long a new stream may wait before RegisterAgent"`
	AgentTimeout    time.Duration     `env:"CONCLAVE_GATEWAY_AGENT_TIMEOUT" default:"0s" help:"how long a registered agent may stay silent before it is deregistered; 0 (the default) keeps a silent agent while its connection lives, since coven heartbeats are optional"`
	// KeepaliveTime and KeepaliveTimeout find dead agents through the
	// transport: a connection silent for KeepaliveTime is pinged (HTTP/2
	// PING, and TCP keepalive probes), and closed when no answer comes
	// within KeepaliveTimeout; its agents are then deregistered.
	KeepaliveTime    time.Duration `env:"CONCLAVE_GATEWAY_KEEPALIVE_TIME" default:"30s" help:"how long a connection may be silent before the gateway pings it (gRPC keepalive, TCP keepalive)"`
	KeepaliveTimeout time.Duration `env:"CONCLAVE_GATEWAY_KEEPALIVE_TIMEOUT" default:"20s" help:"how long the gateway waits for a ping's answer before it closes the connection and deregisters its agents"`
	ShutdownTimeout  time.Duration `env:"CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT" default:"15s" help:"how long in-flight work may drain on shutdown"`
	QueueDepth       int           `env:"CONCLAVE_GATEWAY_QUEUE_DEPTH" default:"32" help:"requests that may wait for a busy agent before callers get RESOURCE_EXHAUSTED"`
	CancelGrace      time.Duration `env:"CONCLAVE_GATEWAY_CANCEL_GRACE" default:"30s" help:"how long an agent may take to end an abandoned request"`
	Lease            time.Duration `env:"CONCLAVE_GATEWAY_LEASE" default:"15s" help:"how long a replica's lease (and so its agents' registrations) outlives its last renewal in the store"`
	AdvertiseAddr    string        `env:"CONCLAVE_GATEWAY_ADVERTISE_ADDR" help:"host:port other replicas reach this one's gRPC listener at (default: the listener's address, or the host name and port)"`
	ClientTokens     []string      `env:"CONCLAVE_GATEWAY_CLIENT_TOKENS" help:"comma-separated bearer tokens accepted on the client API"`
	ClientRate       float64       `env:"CONCLAVE_GATEWAY_CLIENT_RATE" default:"50" help:"client API requests per second each client (bearer token) may make on one replica"`
	ClientBurst      int           `env:"CONCLAVE_GATEWAY_CLIENT_BURST" default:"100" help:"client API requests each client may make at once, above its rate"`
	ClientStreams    int           `env:"CONCLAVE_GATEWAY_CLIENT_STREAMS" default:"64" help:"SendMessage streams each client may hold open on one replica"`
	IdempotencyTTL   time.Duration `env:"CONCLAVE_GATEWAY_IDEMPOTENCY_TTL" default:"24h" help:"how long a SendMessage idempotency_key is remembered"`
	// AllowUnauthenticated opens the client API without tokens; conclave dev
	// sets it, on loopback only.
	AllowUnauthenticated bool     `env:"CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED" default:"false" help:"serve the client API without bearer tokens (development only)"`
	AgentTokens          []string `env:"CONCLAVE_GATEWAY_AGENT_TOKENS" help:"comma-separated agent_id=token pairs; an agent sends its token as authorization: Bearer metadata on AgentStream"`
	// AllowAgentsWithoutTokens lets agents without a configured token
	// register; agents listed in AgentTokens must still present theirs.
	AllowAgentsWithoutTokens bool `env:"CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS" default:"false" help:"let agents with no token in CONCLAVE_GATEWAY_AGENT_TOKENS register (development only)"`
	MaxHeartbeats            int  `env:"CONCLAVE_GATEWAY_MAX_HEARTBEATS" default:"50" help:"heartbeats an agent may send in one second before its stream is closed"`
	// AllowedHosts are answered besides loopback names while the gateway
	// runs without authentication.
	AllowedHosts []string `env:"CONCLAVE_GATEWAY_ALLOWED_HOSTS" help:"comma-separated Host names the HTTP listener answers besides localhost, 127.0.0.1 and [::1] while it runs without authentication"`
	// AuthThrottle is the per-address budget of wrong tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_GATEWAY_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`
}

// unauthenticated reports whether a listener of the gateway runs without
// authentication: it must then bind loopback only.
func (c Config) unauthenticated() bool { return c.AllowUnauthenticated || c.AllowAgentsWithoutTokens }

// Validate implements config.Validator.
func (c Config) Validate() error {
	if c.GRPCAddr == "" {
		return fmt.Errorf("CONCLAVE_GATEWAY_GRPC_ADDR: the gateway needs a gRPC listener")
	}
	if len(c.ClientTokens) == 0 && !c.AllowUnauthenticated {
		return fmt.Errorf("CONCLAVE_GATEWAY_CLIENT_TOKENS: set at least one client token, or CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED=true for development")
	}
	if err := auth.CheckTokens("CONCLAVE_GATEWAY_CLIENT_TOKENS", c.ClientTokens...); err != nil {
		return err
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
	if c.MaxHeartbeats < 1 {
		return fmt.Errorf("CONCLAVE_GATEWAY_MAX_HEARTBEATS: must be positive, got %d", c.MaxHeartbeats)
	}
	if !(c.ClientRate > 0) || math.IsInf(c.ClientRate, 0) {
		return fmt.Errorf("CONCLAVE_GATEWAY_CLIENT_RATE: must be a positive number, got %g", c.ClientRate)
	}
	if c.ClientBurst < 1 {
		return fmt.Errorf("CONCLAVE_GATEWAY_CLIENT_BURST: must be positive, got %d", c.ClientBurst)
	}
	if c.ClientStreams < 1 {
		return fmt.Errorf("CONCLAVE_GATEWAY_CLIENT_STREAMS: must be positive, got %d", c.ClientStreams)
	}
	if c.QueueDepth < 1 || c.QueueDepth > 10000 {
		return fmt.Errorf("CONCLAVE_GATEWAY_QUEUE_DEPTH: must be 1..10000, got %d", c.QueueDepth)
	}
	if c.AgentTimeout < 0 {
		return fmt.Errorf("CONCLAVE_GATEWAY_AGENT_TIMEOUT: must be 0 (off) or positive, got %s", c.AgentTimeout)
	}
	for key, d := range map[string]time.Duration{
		"CONCLAVE_GATEWAY_REGISTER_TIMEOUT":  c.RegisterTimeout,
		"CONCLAVE_GATEWAY_KEEPALIVE_TIME":    c.KeepaliveTime,
		"CONCLAVE_GATEWAY_KEEPALIVE_TIMEOUT": c.KeepaliveTimeout,
		"CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT":  c.ShutdownTimeout,
		"CONCLAVE_GATEWAY_CANCEL_GRACE":      c.CancelGrace,
		"CONCLAVE_GATEWAY_LEASE":             c.Lease,
		"CONCLAVE_GATEWAY_IDEMPOTENCY_TTL":   c.IdempotencyTTL,
	} {
		if d <= 0 {
			return fmt.Errorf("%s: must be positive, got %s", key, d)
		}
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
var Tables = []store.Table{registry.Table, clientapi.IdempotencyTable}

// New builds the gateway's server and services. st holds the cluster-wide
// agent registry; its Tables must exist.
func New(cfg Config, logger *slog.Logger, tel *telemetry.Provider, st store.Store, opts ...server.Option) (*Gateway, error) {
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
	var restAuth *clientapi.RESTAuth
	if !cfg.AllowUnauthenticated {
		tokens := auth.NewTokens(cfg.ClientTokens...).WithThrottle(throttle)
		restAuth = &clientapi.RESTAuth{Tokens: tokens, Throttle: throttle}
		unary, stream := tokens.Protect(clientapi.ServicePrefix)
		grpcOpts = append(grpcOpts, grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	} else {
		logger.Warn("the gateway's client API accepts requests without a bearer token")
	}
	// After authentication, so that only accepted callers spend tokens, each
	// from its own bucket. Zero limits (a Config not loaded from the
	// environment) take clientapi's defaults, the same as the settings'.
	limitUnary, limitStream := clientapi.NewLimiter(clientapi.RateLimits{
		Rate: cfg.ClientRate, Burst: cfg.ClientBurst, Streams: cfg.ClientStreams,
	}).Interceptors(m)
	grpcOpts = append(grpcOpts, grpc.ChainUnaryInterceptor(limitUnary), grpc.ChainStreamInterceptor(limitStream))
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
		// Zero (a Config not loaded from the environment) takes the
		// server's defaults.
		Keepalive: server.Keepalive{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout},
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
	gatewayv1.RegisterGatewayServiceServer(srv.GRPC(), clientapi.New(agents, clientapi.DefaultLimits, serverID, reg, peers,
		clientapi.WithIdempotency(st, cfg.IdempotencyTTL), clientapi.WithLogger(logger), clientapi.WithMetrics(m)))
	srv.OnShutdown(func(context.Context) { _ = peers.Close() })

	if cfg.HTTPAddr != "" {
		// REST goes through this gateway's own gRPC listener, so it passes
		// the same authentication, limits and tracing as gRPC clients.
		// Its calls are marked as the front's, which throttles its own
		// callers' addresses: the gRPC side sees only this process's.
		self, err := srv.SelfClient(append(tel.GRPCDialOptions(), throttle.SelfDialOptions()...)...)
		if err != nil {
			return nil, err
		}
		rest, err := clientapi.NewREST(context.Background(), self, restAuth)
		if err != nil {
			return nil, err
		}
		rest.Routes(srv.Handle, srv.HandleStream)
	}
	srv.OnShutdown(func(ctx context.Context) {
		// The lease goes first: its agents' registrations are then free at
		// once, for them to reconnect through another replica as soon as
		// they are told to, and their disconnections cost no store writes.
		if err := replica.Withdraw(ctx); err != nil {
			logger.WarnContext(ctx, "could not give up this replica's lease; its agents are free when it expires", "error", err)
		}
		agents.Shutdown(ctx, "gateway "+serverID+" is shutting down")
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
		eps = append(eps, server.Endpoint{Service: "gateway", Protocol: "HTTP: REST /v1/agents (SSE), /healthz /readyz /metrics", Address: addr})
	}
	return eps
}
