// Command conclave is the one binary users meet first: `conclave dev` runs
// every Conclave service in one process on embedded storage, and the other
// subcommands are clients and tools.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
)

func main() {
	config.Main("conclave", func(ctx context.Context, args []string) error {
		return run(ctx, args, os.Stdout, os.Stderr)
	})
}

const usage = `Usage: conclave <command> [flags]

Commands:
  dev       run every service in one process on embedded storage
  agent     talk to connected agents: send a message, list them
  librarian ask the Librarian for approval, query it, review, manage tokens
  bridge    the tool bridge: run, list, health, diagnose, mcp (stdio)
  bus       the bus's command line (bub): send-message, subscribe, dlq, serve
  runner    launch and drive ACP agents: launch, prompt, status, logs, cancel, types
  version   print the version
  help      show this help

Run 'conclave <command> -h' for a command's flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "dev":
		return runDev(ctx, rest, os.LookupEnv, stdout, stderr)
	case "agent":
		return runAgent(ctx, rest, stdout, stderr)
	case "librarian":
		return runLibrarian(ctx, rest, os.LookupEnv, stdout, stderr)
	case "bridge":
		return runBridge(ctx, rest, stdout, stderr)
	case "bus":
		return runBus(ctx, rest, stdout, stderr)
	case "runner":
		return runRunner(ctx, rest, os.LookupEnv, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, versionString())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
}
