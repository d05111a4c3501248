// Command agent-host is the entrypoint of an agent's Kubernetes pod: it runs
// the agent command, speaks ACP to it over its stdio (with the runner's own
// client), and dials back to the runner over gRPC to take prompts and
// cancels and to stream the agent's updates and logs (docs/runner-kubernetes.md,
// "agent-host").
//
//	agent-host [flags] -- <agent command> [args...]
//	agent-host <agent command> [args...]
//	agent-host install <path>
//
// install copies agent-host's own binary to path: an agent pod's init
// container runs it to put agent-host where the agent's image can run it,
// with no shell or cp in agent-host's image.
//
// Settings come from CONCLAVE_AGENT_HOST_* (agent-host -h -- lists them);
// the agent gets agent-host's environment without any of them. It exits
// with the agent's exit code (128+n for signal n), 69 when the runner stayed
// unreachable past CONCLAVE_AGENT_HOST_GIVE_UP, 77 when the runner refused
// the link, 127 when the agent could not be started, 2 for bad settings.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/runner/internal/hostlink"
)

type appConfig struct {
	config.Common
	Host hostlink.Settings
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		if errors.Is(err, config.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "agent-host:", err)
	}
	os.Exit(code)
}

// splitArgs separates agent-host's flags from the agent's command: what
// follows "--", or every argument when there is none.
func splitArgs(args []string) (flags, command []string) {
	if i := slices.Index(args, "--"); i >= 0 {
		return args[:i], args[i+1:]
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		return args[:1], nil
	}
	return nil, args
}

func run(ctx context.Context, args []string) (int, error) {
	if len(args) > 0 && args[0] == installCommand {
		return install(args[1:])
	}
	flags, command := splitArgs(args)
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "agent-host", flags, os.LookupEnv, os.Stderr); err != nil {
		return 2, err
	}
	logger := cfg.Logger(os.Stderr, "agent-host")
	// One trace runs API → runner → Job → agent-host → agent: continue the
	// TRACEPARENT the pod was given.
	ctx = telemetry.ExtractEnv(ctx, os.Environ())
	tel, stopTelemetry, err := telemetry.Start(ctx, cfg.Common, "conclave-agent-host", "")
	if err != nil {
		return 2, err
	}
	defer stopTelemetry()
	// Where the agent runs, as the gateway lists it: the pod's name.
	hostname, _ := os.Hostname()
	return hostlink.RunHost(ctx, hostlink.HostOptions{
		Hostname:    hostname,
		Settings:    cfg.Host,
		Command:     command,
		AgentEnv:    hostlink.AgentEnv(os.Environ()),
		Logger:      logger,
		Tracer:      tel.TracerProvider().Tracer("conclave-agent-host"),
		DialOptions: tel.GRPCDialOptions(),
	})
}

// installCommand is the executor's init container's: kube_spec.go.
const installCommand = "install"

func install(args []string) (int, error) {
	if len(args) != 1 {
		return 2, fmt.Errorf("usage: agent-host install <path>")
	}
	self, err := os.Executable()
	if err != nil {
		return 1, fmt.Errorf("install: %w", err)
	}
	if err := hostlink.Install(self, args[0]); err != nil {
		return 1, fmt.Errorf("install: %w", err)
	}
	return 0, nil
}
