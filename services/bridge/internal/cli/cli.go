// Package cli is the bridge's command line: `bridge run|list|health|
// diagnose|mcp`, the same commands as `conclave bridge`.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bridge/internal/toolset"
)

// Usage describes the bridge's commands.
const Usage = `Usage: %[1]s <command> [arguments] [flags]

Commands:
  run TOOL '{json}'  run one tool directly and print its JSON response
  list               list the configured tools
  health             check that every agent's script and interpreter are usable
  diagnose           check config, paths, interpreters and permissions, with a fix for each problem
  mcp                serve MCP on stdin/stdout (for Gemini CLI, Claude Code and other clients)

Flags (all commands): --bridge-config PATH, --bridge-workspace DIR; run '%[1]s <command> -h' for all.
`

// cliConfig is what the commands need: no listener, so no tokens.
type cliConfig struct {
	config.Common
	ConfigFile       string        `env:"CONCLAVE_BRIDGE_CONFIG" default:"config.yaml" help:"path of the bridge's config.yaml (agents, security, workspace)"`
	Workspace        string        `env:"CONCLAVE_BRIDGE_WORKSPACE" help:"workspace root the agents run in, overriding config.yaml's workspace"`
	ProgressInterval time.Duration `env:"CONCLAVE_BRIDGE_PROGRESS_INTERVAL" default:"5s" help:"how often a running tool call sends a progress notification to a client that asked for them"`
	MaxRunning       int           `env:"CONCLAVE_BRIDGE_MAX_RUNNING" default:"16" help:"agents that may run at once; calls beyond are refused with a Busy error"`
}

// IO is a command's standard streams.
type IO struct {
	Stdin  io.ReadCloser
	Stdout io.WriteCloser
	Stderr io.Writer
}

// Main runs `name <command> ...` (`conclave bridge`, or the bridge binary's
// commands). lookup is the environment, for settings and for what agents
// may inherit.
func Main(ctx context.Context, name string, args []string, lookup config.Lookup, std IO, version string) error {
	if len(args) == 0 {
		fmt.Fprintf(std.Stderr, Usage, name)
		return errors.New("no command given")
	}
	cmd, rest := args[0], args[1:]
	var positional []string
	for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		positional, rest = append(positional, rest[0]), rest[1:]
	}
	want := map[string]int{"run": -1, "list": 0, "health": 0, "diagnose": 0, "mcp": 0}
	n, ok := want[cmd]
	switch {
	case cmd == "help" || cmd == "-h" || cmd == "--help":
		fmt.Fprintf(std.Stdout, Usage, name)
		return nil
	case !ok:
		fmt.Fprintf(std.Stderr, Usage, name)
		return fmt.Errorf("unknown command %q", cmd)
	case cmd == "run" && (len(positional) < 1 || len(positional) > 2):
		return fmt.Errorf("usage: %s run TOOL '{\"param\": \"value\"}' [flags]", name)
	case n == 0 && len(positional) > 0:
		return fmt.Errorf("%s %s takes no arguments, got %q", name, cmd, positional[0])
	}
	var cc cliConfig
	cc.LogFormat = "text"
	if err := config.Load(ctx, &cc, name+" "+cmd, rest, lookup, std.Stderr); err != nil {
		return err
	}
	cfg := toolset.Settings{ConfigFile: cc.ConfigFile, Workspace: cc.Workspace, ProgressInterval: cc.ProgressInterval, MaxRunning: cc.MaxRunning, Env: lookup, Version: version}
	logger := cc.Logger(std.Stderr, "bridge")
	switch cmd {
	case "run":
		params := "{}"
		if len(positional) == 2 {
			params = positional[1]
		}
		out, err := toolset.Call(ctx, cfg, logger, positional[0], json.RawMessage(params))
		if out != nil {
			fmt.Fprintln(std.Stdout, string(out))
		}
		return err
	case "list":
		tools, err := toolset.List(cfg)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(std.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tTIMEOUT\tSCRIPT\tDESCRIPTION")
		for _, t := range tools {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Timeout, t.Script, t.Description)
		}
		return tw.Flush()
	case "health":
		h, err := toolset.CheckHealth(cfg, logger)
		if err != nil {
			return err
		}
		b, _ := json.MarshalIndent(h, "", "  ")
		fmt.Fprintln(std.Stdout, string(b))
		if !h.Healthy {
			return errors.New("some agents cannot run; `diagnose` suggests fixes")
		}
		return nil
	case "diagnose":
		findings := toolset.Diagnose(cfg)
		problems := 0
		for _, f := range findings {
			if f.OK {
				fmt.Fprintf(std.Stdout, "ok       %s\n", f.What)
				continue
			}
			if f.Warning {
				fmt.Fprintf(std.Stdout, "warning  %s\n         fix: %s\n", f.What, f.Fix)
				continue
			}
			problems++
			fmt.Fprintf(std.Stdout, "PROBLEM  %s\n         fix: %s\n", f.What, f.Fix)
		}
		if problems > 0 {
			return fmt.Errorf("%d problem(s) found", problems)
		}
		fmt.Fprintln(std.Stdout, "no problems found")
		return nil
	default: // mcp
		tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "conclave-bridge", ServiceVersion: version})
		if err != nil {
			return err
		}
		defer func() { _ = tel.Shutdown(context.WithoutCancel(ctx)) }()
		return toolset.ServeStdio(ctx, cfg, logger, tel, std.Stdin, std.Stdout)
	}
}
