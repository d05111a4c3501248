// Package service wires the tool bridge (the ADK bridge's
// hybrid protocol served over MCP) into a runnable server:
// the configured agents as MCP tools over streamable HTTP, and the same
// tools over stdio and from the command line for `conclave bridge`. It is
// the one entry point shared by cmd/bridge and `conclave dev`.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/govern"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bridge/internal/cli"
	"github.com/conclave-ai/conclave/services/bridge/internal/mcphttp"
	"github.com/conclave-ai/conclave/services/bridge/internal/mcpserver"
	"github.com/conclave-ai/conclave/services/bridge/internal/tools"
	"github.com/conclave-ai/conclave/services/bridge/internal/toolset"
)

// MCPPath is where the streamable HTTP endpoint is served.
const MCPPath = "/mcp"

// Config is the bridge's configuration. The agents themselves are in the
// config.yaml that ConfigFile names.
type Config struct {
	ConfigFile      string            `env:"CONCLAVE_BRIDGE_CONFIG" default:"config.yaml" help:"path of the bridge's config.yaml (agents, security, workspace)"`
	Workspace       string            `env:"CONCLAVE_BRIDGE_WORKSPACE" help:"workspace root the agents run in, overriding config.yaml's workspace"`
	HTTPAddr        config.ListenAddr `env:"CONCLAVE_BRIDGE_HTTP_ADDR" default:":8083" help:"HTTP listener: MCP streamable HTTP on /mcp, health and metrics"`
	Tokens          []string          `env:"CONCLAVE_BRIDGE_TOKENS" help:"comma-separated bearer tokens accepted on /mcp"`
	ShutdownTimeout time.Duration     `env:"CONCLAVE_BRIDGE_SHUTDOWN_TIMEOUT" default:"15s" validate:"positive" help:"how long running tool calls may drain on shutdown"`
	// ProgressInterval paces the notifications of long calls.
	ProgressInterval time.Duration `env:"CONCLAVE_BRIDGE_PROGRESS_INTERVAL" default:"5s" validate:"positive" help:"how often a running tool call sends a progress notification to a client that asked for them"`
	MaxRequestBytes  int64         `env:"CONCLAVE_BRIDGE_MAX_REQUEST_BYTES" default:"4194304" help:"largest MCP request body accepted over HTTP"`
	Rate             float64       `env:"CONCLAVE_BRIDGE_RATE" default:"20" help:"MCP requests per second each client (bearer token, or address without tokens) may make"`
	Burst            int           `env:"CONCLAVE_BRIDGE_BURST" default:"40" validate:"positive" help:"MCP requests each client may make at once, above its rate"`
	MaxRunning       int           `env:"CONCLAVE_BRIDGE_MAX_RUNNING" default:"16" validate:"positive" help:"agents that may run at once; calls beyond are refused with a Busy error"`
	// Governed tools ask the Librarian (docs/governance.md).
	LibrarianURL   string `env:"CONCLAVE_BRIDGE_LIBRARIAN_URL" help:"the Librarian's API (http(s)://host[:port][/stage]) governed tools ask before they run; required when config.yaml has one"`
	LibrarianToken string `env:"CONCLAVE_BRIDGE_LIBRARIAN_TOKEN" help:"the bridge's Librarian agent token (empty only for a Librarian that takes none, in development)"`
	LibrarianAgent string `env:"CONCLAVE_BRIDGE_LIBRARIAN_AGENT" default:"conclave-bridge" help:"the bridge's agent_id in the Librarian's agents.yaml, which its token is for"`
	BusURL         string `env:"CONCLAVE_BRIDGE_BUS_URL" help:"the bus's WebSocket URL, where the Librarian's decisions on escalated calls arrive; without it an escalated call is refused at once"`
	BusToken       string `env:"CONCLAVE_BRIDGE_BUS_TOKEN" help:"bearer token of a bus grant that may subscribe to system:librarian.request.*"`

	// AllowUnauthenticated opens /mcp without tokens; conclave dev sets it,
	// on loopback only.
	AllowUnauthenticated bool `env:"CONCLAVE_BRIDGE_ALLOW_UNAUTHENTICATED" default:"false" help:"serve /mcp without bearer tokens (development only)"`
	// AllowedHosts are answered besides loopback names while the bridge
	// runs without authentication.
	AllowedHosts []string `env:"CONCLAVE_BRIDGE_ALLOWED_HOSTS" help:"comma-separated Host names the HTTP listener answers besides localhost, 127.0.0.1 and [::1] while it runs without authentication"`
	// AuthThrottle is the per-address budget of wrong tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_BRIDGE_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`

	// Env supplies the variables agents may inherit (config.yaml's
	// environment.pass and each agent's env); nil passes none.
	Env config.Lookup
	// Version is reported to MCP clients.
	Version string
}

// Validate implements config.Validator.
func (c Config) Validate() error {
	if err := config.Check(c); err != nil {
		return err
	}
	if c.ConfigFile == "" {
		return fmt.Errorf("CONCLAVE_BRIDGE_CONFIG: the bridge needs its config.yaml")
	}
	if len(c.Tokens) == 0 && !c.AllowUnauthenticated && c.HTTPAddr != "" {
		return fmt.Errorf("CONCLAVE_BRIDGE_TOKENS: set at least one bearer token, or CONCLAVE_BRIDGE_ALLOW_UNAUTHENTICATED=true for development")
	}
	if err := auth.CheckTokens("CONCLAVE_BRIDGE_TOKENS", c.Tokens...); err != nil {
		return err
	}
	if c.AllowUnauthenticated {
		if err := httpguard.CheckListen("CONCLAVE_BRIDGE_HTTP_ADDR", string(c.HTTPAddr), "CONCLAVE_BRIDGE_ALLOW_UNAUTHENTICATED"); err != nil {
			return err
		}
	}
	if c.MaxRequestBytes < 1024 {
		return fmt.Errorf("CONCLAVE_BRIDGE_MAX_REQUEST_BYTES: must be at least 1024, got %d", c.MaxRequestBytes)
	}
	if !(c.Rate > 0) {
		return fmt.Errorf("CONCLAVE_BRIDGE_RATE: must be a positive number, got %g", c.Rate)
	}
	return c.validateGovernance()
}

// toolSettings are the settings the bridge's agents run with.
func (c Config) toolSettings() toolset.Settings {
	return toolset.Settings{ConfigFile: c.ConfigFile, Workspace: c.Workspace, ProgressInterval: c.ProgressInterval,
		MaxRunning: c.MaxRunning, LibrarianURL: c.LibrarianURL, LibrarianToken: c.LibrarianToken,
		LibrarianAgent: c.LibrarianAgent, BusURL: c.BusURL, BusToken: c.BusToken, Env: c.Env, Version: c.Version}
}

// validateGovernance checks the Librarian's and the bus's settings.
func (c Config) validateGovernance() error {
	for _, u := range []struct{ key, url, scheme string }{
		{"CONCLAVE_BRIDGE_LIBRARIAN_URL", c.LibrarianURL, "http"}, {"CONCLAVE_BRIDGE_BUS_URL", c.BusURL, "ws"},
	} {
		if u.url == "" {
			continue
		}
		if p, err := url.Parse(u.url); err != nil || (p.Scheme != u.scheme && p.Scheme != u.scheme+"s") || p.Host == "" {
			return fmt.Errorf("%s: %q is not a %s:// or %ss:// URL", u.key, u.url, u.scheme, u.scheme)
		}
	}
	if c.LibrarianToken != "" && len(c.LibrarianToken) < 16 {
		return fmt.Errorf("CONCLAVE_BRIDGE_LIBRARIAN_TOKEN: a token of at least 16 characters")
	}
	return nil
}

// IO is a command's standard streams.
type IO = cli.IO

// Main runs `name <command> ...` (`conclave bridge`, or the bridge binary's
// commands): internal/cli. lookup is the environment, for settings and for
// what agents may inherit.
func Main(ctx context.Context, name string, args []string, lookup config.Lookup, std IO, version string) error {
	return cli.Main(ctx, name, args, lookup, std, version)
}

// Bridge is a configured, not yet running, bridge HTTP server.
type Bridge struct {
	srv    *server.Server
	runner *tools.Runner
	// watcher hears the Librarian's decisions for governed tools (nil:
	// none is configured).
	watcher *govern.Watcher
	// endCalls cancels the tool calls still running once the server has
	// stopped (the drain deadline passed), so that no agent outlives it.
	endCalls context.CancelFunc
}

// Deps are what the bridge runs on: it keeps no state.
type Deps struct {
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
}

// New checks cfg, loads config.yaml and builds the HTTP server: streamable
// HTTP MCP on MCPPath behind bearer tokens and a per-client rate limit.
func New(cfg Config, deps Deps, opts ...server.Option) (*Bridge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger, tel := deps.Logger, deps.Telemetry
	runner, watcher, err := toolset.Load(cfg.toolSettings(), logger, tel)
	if err != nil {
		return nil, err
	}
	opts = append([]server.Option{
		server.WithHTTPErrorWriter(mcphttp.WriteHTTPError),
		server.WithMetricsHandler(tel.MetricsHandler()),
		server.WithHTTPMiddleware(func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "bridge") }),
	}, opts...)
	if cfg.AllowUnauthenticated {
		opts = append(opts, server.WithDevelopmentGuard(cfg.AllowedHosts))
	}
	srv, err := server.New(server.Config{
		Name:                "bridge",
		HTTPAddr:            string(cfg.HTTPAddr),
		ShutdownTimeout:     cfg.ShutdownTimeout,
		MaxRequestBodyBytes: cfg.MaxRequestBytes,
	}, logger, opts...)
	if err != nil {
		return nil, fmt.Errorf("bridge server: %w", err)
	}
	calls, endCalls := context.WithCancel(context.Background())
	mcpSrv := mcpserver.New(runner, cfg.toolSettings().MCPOptions(logger, calls))
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return mcpSrv }, &mcp.StreamableHTTPOptions{
		Logger: logger,
		// Idle sessions are dropped, so abandoned clients free their state.
		SessionTimeout: 30 * time.Minute,
		// The SDK's DNS rebinding protection refuses a request that
		// reaches a loopback listener with another Host: right without
		// tokens (the development guard checks the same), but a bridge
		// that requires a bearer token, which a rebound page cannot
		// present, is also reached through loopback relays and proxies
		// under their own names (an agent in a pod, through a forward).
		DisableLocalhostProtection: !cfg.AllowUnauthenticated,
	})
	if cfg.AllowUnauthenticated {
		logger.Warn("the bridge's MCP endpoint accepts requests without a bearer token")
	}
	throttle := auth.NewThrottle(cfg.AuthThrottle.Options(telemetry.AuthThrottled(tel.Meter("bridge"), "bridge")))
	protected := mcphttp.Guard(mcphttp.GuardSettings{Tokens: cfg.Tokens, Rate: cfg.Rate, Burst: cfg.Burst,
		AllowUnauthenticated: cfg.AllowUnauthenticated}, throttle, mcphttp.JSONRPCErrors(handler))
	// A tool call (a POST) lasts as long as its agent, up to its timeout:
	// on SIGTERM it is drained, so that it finishes with its result, while
	// new calls are refused. GET /mcp is the session's server-sent event
	// stream, which never ends on its own; the server ends it once the
	// calls are done.
	srv.HandleDrained(MCPPath, protected)
	srv.HandleStream("GET "+MCPPath, protected)
	return &Bridge{srv: srv, runner: runner, watcher: watcher, endCalls: endCalls}, nil
}

// Run serves until ctx is cancelled, then drains: running tool calls
// finish, within ShutdownTimeout, and those still running after it are
// cancelled (their agents killed).
func (b *Bridge) Run(ctx context.Context) error {
	defer toolset.Watch(b.watcher)()
	defer b.endCalls()
	return b.srv.Run(ctx)
}

// Ready is closed once the listener is bound.
func (b *Bridge) Ready() <-chan struct{} { return b.srv.Ready() }

// Endpoints lists where the bridge listens, once Ready.
func (b *Bridge) Endpoints() []server.Endpoint {
	addr := b.srv.HTTPAddr()
	if addr == "" {
		return nil
	}
	return []server.Endpoint{{Service: "bridge", Protocol: fmt.Sprintf("HTTP: MCP streamable HTTP %s (%d tools), /healthz /readyz /metrics", MCPPath, len(b.runner.Names())+1), Address: addr}}
}
