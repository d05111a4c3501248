// Package service wires the web console into a runnable server. It is the
// one entry point shared by cmd/console and the all-in-one `conclave dev`.
// The console keeps no state of its own beyond memory: it is a client of
// the gateway's, the bus's, the runner's and the Librarian's public APIs.
package service

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/metrics"
	"github.com/conclave-ai/conclave/services/console/internal/session"
	"github.com/conclave-ai/conclave/services/console/internal/web"
)

// Config is the console's configuration.
type Config struct {
	HTTPAddr     config.ListenAddr `env:"CONCLAVE_CONSOLE_HTTP_ADDR" default:":8090" help:"HTTP listener: the console's pages, /healthz /readyz /metrics"`
	GatewayURL   string            `env:"CONCLAVE_CONSOLE_GATEWAY_URL" default:"http://127.0.0.1:8080" help:"the gateway's HTTP (REST client API) URL"`
	BusURL       string            `env:"CONCLAVE_CONSOLE_BUS_URL" default:"ws://127.0.0.1:7892" help:"the bus's WebSocket URL (its dead-letter API is on the same listener)"`
	RunnerURL    string            `env:"CONCLAVE_CONSOLE_RUNNER_URL" default:"http://127.0.0.1:8082" help:"the runner's REST URL"`
	LibrarianURL string            `env:"CONCLAVE_CONSOLE_LIBRARIAN_URL" default:"http://127.0.0.1:8081" help:"the Librarian's API URL"`
	JaegerURL    string            `env:"CONCLAVE_CONSOLE_JAEGER_URL" help:"Jaeger's UI as browsers reach it, e.g. http://127.0.0.1:16686: trace pages link there"`
	// JaegerQueryURL is where the console itself reads traces; in a
	// cluster it differs from the browser's way to the UI.
	JaegerQueryURL string `env:"CONCLAVE_CONSOLE_JAEGER_QUERY_URL" help:"Jaeger's query service as the console reaches it, e.g. http://jaeger-query:16686: trace ids open the console's own page of the trace, read from its API (default: CONCLAVE_CONSOLE_JAEGER_URL)"`
	// SessionKey seals session cookies; replicas behind one load balancer
	// need the same one.
	SessionKey           string        `env:"CONCLAVE_CONSOLE_SESSION_KEY" help:"base64 of 32 random bytes sealing the session cookies (default: generated at start, so sessions end with the process)"`
	SessionTTL           time.Duration `env:"CONCLAVE_CONSOLE_SESSION_TTL" default:"8h" validate:"positive" help:"how long a sign-in lasts"`
	SecureCookies        bool          `env:"CONCLAVE_CONSOLE_SECURE_COOKIES" default:"false" help:"mark the session cookie Secure (set it when the console is served over https)"`
	AllowUnauthenticated bool          `env:"CONCLAVE_CONSOLE_ALLOW_UNAUTHENTICATED" default:"false" help:"open the console without sign-in, calling the services without tokens (development only)"`
	EventsBusToken       string        `env:"CONCLAVE_CONSOLE_EVENTS_BUS_TOKEN" help:"the console's own bus token, allowed to subscribe to system:librarian.request.*, for the recent decisions (open buses need none)"`
	LibrarianAgentID     string        `env:"CONCLAVE_CONSOLE_LIBRARIAN_AGENT_ID" help:"the Librarian agent the knowledge-graph search asks as (its token is given at sign-in)"`
	BackendTimeout       time.Duration `env:"CONCLAVE_CONSOLE_BACKEND_TIMEOUT" default:"10s" validate:"positive" help:"how long one call to a service may take"`
	ChatTimeout          time.Duration `env:"CONCLAVE_CONSOLE_CHAT_TIMEOUT" default:"10m" validate:"positive" help:"how long one chat with an agent may stream"`
	RefreshInterval      time.Duration `env:"CONCLAVE_CONSOLE_REFRESH_INTERVAL" default:"2s" validate:"positive" help:"how often live lists (agents, an instance's status) are read again"`
	MaxStreams           int           `env:"CONCLAVE_CONSOLE_MAX_STREAMS" default:"256" validate:"positive" help:"live streams (Server-Sent Events) open at once"`
	StreamMaxAge         time.Duration `env:"CONCLAVE_CONSOLE_STREAM_MAX_AGE" default:"30m" validate:"positive" help:"how long a live stream lasts before the browser reconnects it"`
	ShutdownTimeout      time.Duration `env:"CONCLAVE_CONSOLE_SHUTDOWN_TIMEOUT" default:"15s" validate:"positive" help:"how long in-flight requests may drain on shutdown"`
	// AllowedHosts are answered besides loopback names while the console
	// is open without sign-in.
	AllowedHosts []string `env:"CONCLAVE_CONSOLE_ALLOWED_HOSTS" help:"comma-separated Host names the console answers besides localhost, 127.0.0.1 and [::1] while it is open without sign-in"`
	// AuthThrottle is the per-address budget of wrong sign-in tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_CONSOLE_AUTH_THROTTLE" default:"20/1s" help:"wrong sign-in tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`
}

func (c Config) jaegerQueryURL() string {
	if c.JaegerQueryURL != "" {
		return c.JaegerQueryURL
	}
	return c.JaegerURL
}

// Validate implements config.Validator.
func (c Config) Validate() error {
	if err := config.Check(c); err != nil {
		return err
	}
	if _, err := c.sessionKey(); err != nil {
		return err
	}
	if c.AllowUnauthenticated {
		if err := httpguard.CheckListen("CONCLAVE_CONSOLE_HTTP_ADDR", string(c.HTTPAddr), "CONCLAVE_CONSOLE_ALLOW_UNAUTHENTICATED"); err != nil {
			return err
		}
	}
	if c.EventsBusToken != "" {
		if err := auth.CheckTokens("CONCLAVE_CONSOLE_EVENTS_BUS_TOKEN", c.EventsBusToken); err != nil {
			return err
		}
	}
	for key, u := range map[string]string{
		"CONCLAVE_CONSOLE_GATEWAY_URL":      c.GatewayURL,
		"CONCLAVE_CONSOLE_RUNNER_URL":       c.RunnerURL,
		"CONCLAVE_CONSOLE_LIBRARIAN_URL":    c.LibrarianURL,
		"CONCLAVE_CONSOLE_JAEGER_URL":       c.JaegerURL,
		"CONCLAVE_CONSOLE_JAEGER_QUERY_URL": c.JaegerQueryURL,
	} {
		if err := checkURL(u, "http", "https"); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	if err := checkURL(c.BusURL, "ws", "wss"); err != nil {
		return fmt.Errorf("CONCLAVE_CONSOLE_BUS_URL: %w", err)
	}
	return nil
}

// checkURL accepts an empty URL (the service is not used) or an absolute
// one with one of schemes.
func checkURL(raw string, schemes ...string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	for _, s := range schemes {
		if u.Scheme == s && u.Host != "" {
			return nil
		}
	}
	return fmt.Errorf("%q is not a %s URL with a host", raw, strings.Join(schemes, " or "))
}

// sessionKey decodes the configured key, or makes one. The error never
// repeats the value: it is a secret.
func (c Config) sessionKey() ([]byte, error) {
	if c.SessionKey == "" {
		return session.GenerateKey(), nil
	}
	key, err := base64.StdEncoding.DecodeString(c.SessionKey)
	if err != nil {
		key, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(c.SessionKey, "="))
	}
	if err != nil || len(key) != session.KeySize {
		return nil, fmt.Errorf("CONCLAVE_CONSOLE_SESSION_KEY: want base64 of %d bytes (openssl rand -base64 %d)", session.KeySize, session.KeySize)
	}
	return key, nil
}

// Backends are the services' addresses, for a console whose services
// bind after it is built (conclave dev). An empty address is a service not
// reachable yet.
type Backends struct {
	GatewayURL, BusURL, RunnerURL, LibrarianURL string
}

// Deps are what the console runs on: it keeps no state.
type Deps struct {
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
	// Backends, when set, is asked for the services' addresses at each
	// call, instead of using the Config's (conclave dev: known once each
	// listens).
	Backends func() Backends
}

// Console is a configured, not yet running, console.
type Console struct {
	srv  *server.Server
	web  *web.Handler
	cfg  Config
	log  *slog.Logger
	stop context.CancelFunc
}

// New checks cfg and builds the console.
func New(cfg Config, deps Deps, opts ...server.Option) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger, tel, b := deps.Logger, deps.Telemetry, deps.Backends
	if b == nil {
		b = func() Backends {
			return Backends{GatewayURL: cfg.GatewayURL, BusURL: cfg.BusURL, RunnerURL: cfg.RunnerURL, LibrarianURL: cfg.LibrarianURL}
		}
	}
	key, err := cfg.sessionKey()
	if err != nil {
		return nil, err
	}
	codec, err := session.NewCodec(key, cfg.SessionTTL, cfg.SecureCookies)
	if err != nil {
		return nil, fmt.Errorf("console sessions: %w", err)
	}
	if cfg.SessionKey == "" {
		logger.Info("the console generated its session key: sessions end when it stops; set CONCLAVE_CONSOLE_SESSION_KEY to keep them, or to share them between replicas")
	}
	if cfg.AllowUnauthenticated {
		logger.Warn("the console is open without sign-in and calls the services without tokens")
	}
	m := metrics.New(tel.Meter("console"))
	// No client-wide timeout: streams (replies, logs) last as long as
	// they need; each unary call has its own deadline.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.ResponseHeaderTimeout = cfg.BackendTimeout
	httpClient := &http.Client{Transport: tel.HTTPTransport(transport)}
	client := func(service string, base func() string) *backend.Client {
		return &backend.Client{Service: service, Base: base, HTTP: httpClient, Timeout: cfg.BackendTimeout, Observe: m.Call}
	}
	base, stop := context.WithCancel(context.Background())
	h, err := web.New(base, web.Options{
		Codec:            codec,
		Open:             cfg.AllowUnauthenticated,
		JaegerURL:        cfg.JaegerURL,
		JaegerQueryURL:   cfg.jaegerQueryURL(),
		LibrarianAgentID: cfg.LibrarianAgentID,
		Gateway:          backend.Gateway{Client: client("gateway", func() string { return b().GatewayURL })},
		Bus: backend.Bus{Client: client("bus", func() string { return backend.HTTPBase(b().BusURL) }),
			WebSocketURL: func() string { return b().BusURL }, MaxFrameBytes: 1 << 20},
		Runner:          backend.Runner{Client: client("runner", func() string { return b().RunnerURL })},
		Librarian:       backend.Librarian{Client: client("librarian", func() string { return b().LibrarianURL })},
		Jaeger:          backend.Jaeger{Client: client("jaeger", cfg.jaegerQueryURL)},
		RefreshInterval: cfg.RefreshInterval,
		MaxStreams:      cfg.MaxStreams,
		StreamMaxAge:    cfg.StreamMaxAge,
		ChatTimeout:     cfg.ChatTimeout,
		SignInThrottle:  auth.NewThrottle(cfg.AuthThrottle.Options(telemetry.AuthThrottled(tel.Meter("console"), "console"))),
		Metrics:         m,
		Logger:          logger,
	})
	if err != nil {
		stop()
		return nil, err
	}
	srvOpts := append([]server.Option{
		// The console's one error shape, also for what the server
		// answers itself (unknown paths, wrong methods, bodies over 1 MiB).
		server.WithHTTPErrorWriter(web.WriteHTTPError),
		server.WithMetricsHandler(tel.MetricsHandler()),
		server.WithHTTPMiddleware(func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "console") }),
	}, opts...)
	if cfg.AllowUnauthenticated {
		srvOpts = append(srvOpts, server.WithDevelopmentGuard(cfg.AllowedHosts))
	}
	srv, err := server.New(server.Config{
		Name:            "console",
		HTTPAddr:        string(cfg.HTTPAddr),
		ShutdownTimeout: cfg.ShutdownTimeout,
		// A chat message may be 256 KiB, form-encoded.
		MaxRequestBodyBytes: 1 << 20,
	}, logger, srvOpts...)
	if err != nil {
		stop()
		return nil, fmt.Errorf("console server: %w", err)
	}
	// The console's posts are its forms (and its scripts', form-encoded
	// too), each with a CSRF token; they take that type alone.
	forms := func(register func(string, http.Handler)) func(string, http.Handler) {
		return func(pattern string, h http.Handler) { register(pattern, server.AcceptContentTypes(h, httpguard.Form)) }
	}
	h.Routes(forms(srv.Handle), forms(srv.HandleStream))
	// Chats with agents run under base: they end with the console.
	srv.OnShutdown(func(context.Context) { stop() })
	return &Console{srv: srv, web: h, cfg: cfg, log: logger, stop: stop}, nil
}

// Run serves until ctx is cancelled, then drains. Meanwhile it watches the
// bus for the Librarian's decisions, when it may (an open console, or a
// bus token of its own).
func (c *Console) Run(ctx context.Context) error {
	defer c.stop()
	if c.cfg.AllowUnauthenticated || c.cfg.EventsBusToken != "" {
		watchCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-c.srv.Ready():
			case <-watchCtx.Done():
				return
			}
			c.web.WatchDecisions(watchCtx, c.cfg.EventsBusToken)
		}()
	}
	err := c.srv.Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Ready is closed once the listener is bound.
func (c *Console) Ready() <-chan struct{} { return c.srv.Ready() }

// Endpoints lists where the console listens, once Ready.
func (c *Console) Endpoints() []server.Endpoint {
	return []server.Endpoint{{Service: "console", Protocol: "HTTP: web console /, /healthz /readyz /metrics", Address: c.srv.HTTPAddr()}}
}

// URL is the console's address, once Ready.
func (c *Console) URL() string { return "http://" + c.srv.HTTPAddr() }
