// Package toolset loads the bridge's config.yaml into the runner of its
// agents, with what its governed tools ask the Librarian with, and runs
// them outside the HTTP server: over stdio MCP and once from the command
// line.
package toolset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/govern"
	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bridge/internal/agentconfig"
	"github.com/conclave-ai/conclave/services/bridge/internal/mcpserver"
	"github.com/conclave-ai/conclave/services/bridge/internal/mcpstdio"
	"github.com/conclave-ai/conclave/services/bridge/internal/tools"
)

// defaultMaxRunning is CONCLAVE_BRIDGE_MAX_RUNNING's default, taken for a
// MaxRunning below 1: the commands' settings are not validated.
const defaultMaxRunning = 16

// Settings are the bridge's settings that its agents run with (the
// CONCLAVE_BRIDGE_* of the same names).
type Settings struct {
	ConfigFile       string
	Workspace        string
	ProgressInterval time.Duration
	MaxRunning       int
	// Governed tools ask the Librarian at LibrarianURL, as LibrarianAgent;
	// its decisions on escalated calls arrive over the bus at BusURL.
	LibrarianURL, LibrarianToken, LibrarianAgent string
	BusURL, BusToken                             string
	// Env supplies the variables agents may inherit (config.yaml's
	// environment.pass and each agent's env); nil passes none.
	Env config.Lookup
	// Version is reported to MCP clients.
	Version string
}

func (c Settings) lookup(key string) (string, bool) {
	if c.Env == nil {
		return "", false
	}
	return c.Env(key)
}

// MCPOptions are the options of an MCP server of the bridge's tools whose
// calls run under calls.
func (c Settings) MCPOptions(logger *slog.Logger, calls context.Context) mcpserver.Options {
	progress := c.ProgressInterval
	if progress <= 0 {
		progress = 5 * time.Second
	}
	return mcpserver.Options{Version: c.Version, ProgressInterval: progress, Logger: logger, Calls: calls}
}

// Load loads config.yaml and the runner of its agents, with what its
// governed tools ask the Librarian with: the watcher, when not nil, must
// run (Watch) while calls are made.
func Load(cfg Settings, logger *slog.Logger, tel *telemetry.Provider) (*tools.Runner, *govern.Watcher, error) {
	agents, err := agentconfig.Load(cfg.ConfigFile, cfg.Workspace, cfg.lookup)
	if err != nil {
		return nil, nil, err
	}
	maxRunning := cfg.MaxRunning
	if maxRunning < 1 {
		maxRunning = defaultMaxRunning
	}
	var meter metric.Meter
	if tel != nil {
		meter = tel.Meter("bridge")
	}
	r, err := tools.New(agents, logger, meter, maxRunning)
	if err != nil {
		return nil, nil, err
	}
	watcher, err := governance(cfg, agents, r, logger, tel)
	return r, watcher, err
}

// Watch runs w (if any) until the func it returns is called.
func Watch(w *govern.Watcher) (stop func()) {
	if w == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	return func() { cancel(); <-done }
}

// ServeStdio serves MCP on in and out (a client's pipes) until the client
// closes in or ctx ends. Nothing but protocol frames is written to out; logs
// go to logger.
func ServeStdio(ctx context.Context, cfg Settings, logger *slog.Logger, tel *telemetry.Provider, in io.ReadCloser, out io.WriteCloser) error {
	runner, watcher, err := Load(cfg, logger, tel)
	if err != nil {
		return err
	}
	defer Watch(watcher)()
	// The end of ctx (SIGTERM, SIGINT) cancels the calls running: the SDK
	// would otherwise wait for them before it ends the session. The end of
	// stdin does not: every request read is answered first.
	s := mcpserver.New(runner, cfg.MCPOptions(logger, ctx))
	// Lines that are not JSON-RPC messages are answered with -32700 or
	// -32600 by the transport, and the session goes on.
	err = s.Run(ctx, mcpstdio.NewTransport(in, out, logger))
	if ctx.Err() != nil || isClosedPipe(err) {
		return nil
	}
	return fmt.Errorf("mcp stdio: %w", err)
}

// Call runs tool name with args (a JSON object) once and returns the JSON
// object to print: the agent's response, or the bridge's error in the same
// form. err is non-nil for an unknown tool and a broken configuration, and
// for every failed call, so that a command can exit non-zero.
func Call(ctx context.Context, cfg Settings, logger *slog.Logger, name string, args json.RawMessage) (json.RawMessage, error) {
	runner, watcher, err := Load(cfg, logger, nil)
	if err != nil {
		return nil, err
	}
	defer Watch(watcher)()
	resp, err := runner.Call(ctx, name, args)
	if err != nil {
		var he *hybrid.Error
		if errors.As(err, &he) {
			return he.Response(), err
		}
		return nil, fmt.Errorf("%w; configured tools: %v", err, runner.Names())
	}
	if resp.Status == hybrid.StatusError {
		return resp.Object, fmt.Errorf("%s answered with an error: %s", name, resp.Error)
	}
	return resp.Object, nil
}

// Tool describes one configured tool.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Script      string          `json:"script"`
	Interpreter string          `json:"interpreter"`
	Timeout     string          `json:"timeout"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// List returns the configured tools.
func List(cfg Settings) ([]Tool, error) {
	agents, err := agentconfig.Load(cfg.ConfigFile, cfg.Workspace, cfg.lookup)
	if err != nil {
		return nil, err
	}
	out := make([]Tool, 0, len(agents.Agents))
	for _, a := range agents.Agents {
		out = append(out, Tool{Name: a.Name, Description: a.Description, Script: a.Run.Script,
			Interpreter: a.Run.Interpreter, Timeout: a.Run.Timeout.String(), InputSchema: a.InputSchema})
	}
	return out, nil
}

// Health is the bridge's health report, as the health_check tool returns it.
type Health = tools.Health

// CheckHealth reports whether every agent's script and interpreter exist and
// are usable.
func CheckHealth(cfg Settings, logger *slog.Logger) (Health, error) {
	runner, _, err := Load(cfg, logger, nil)
	if err != nil {
		return Health{}, err
	}
	return runner.Health(), nil
}
