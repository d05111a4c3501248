package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	librarian "github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/startup"
	bridge "github.com/conclave-ai/conclave/services/bridge/service"
	bus "github.com/conclave-ai/conclave/services/bus/service"
	console "github.com/conclave-ai/conclave/services/console/service"
	gateway "github.com/conclave-ai/conclave/services/gateway/service"
	runner "github.com/conclave-ai/conclave/services/runner/service"
)

// devConfig is every service's configuration, loaded once; shared keys
// (logging, telemetry) are set by one flag or variable.
type devConfig struct {
	config.Common
	Storage   config.Storage
	Gateway   gateway.Config
	Librarian librarian.Config
	Bridge    bridge.Config
	Bus       bus.Config
	Runner    runner.Config
	Console   console.Config
}

// exampleToolAgents is the bridge configuration conclave dev serves when run
// from the repository's root, as `make run` does.
const exampleToolAgents = "examples/tool-agents/config.yaml"

// service is what conclave dev runs: each service's own server, in one
// process.
type service interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
	Endpoints() []server.Endpoint
}

func runDev(ctx context.Context, args []string, lookup config.Lookup, stdout, stderr io.Writer) error {
	var cfg devConfig
	// On a laptop the defaults listen on loopback only and log as text.
	cfg.LogFormat = "text"
	cfg.Gateway.GRPCAddr = "127.0.0.1:50051"
	cfg.Gateway.HTTPAddr = "127.0.0.1:8080"
	cfg.Gateway.ServerID = "dev"
	// Loopback only, so neither clients nor agents need a token in
	// development; an agent given one in CONCLAVE_GATEWAY_AGENT_TOKENS must
	// still present it.
	cfg.Gateway.AllowUnauthenticated = true
	cfg.Gateway.AllowAgentsWithoutTokens = true
	cfg.Librarian.HTTPAddr = "127.0.0.1:8081"
	cfg.Librarian.AllowUnauthenticated = true
	// The example tool agents, run from the repository's root.
	cfg.Bridge.HTTPAddr = "127.0.0.1:8083"
	cfg.Bridge.ConfigFile = exampleToolAgents
	cfg.Bridge.AllowUnauthenticated = true
	cfg.Bus.Addr = "127.0.0.1:7892"
	cfg.Bus.ServerID = "dev"
	cfg.Bus.AllowUnauthenticated = true
	cfg.Runner.GRPCAddr = "127.0.0.1:50052"
	cfg.Runner.HTTPAddr = "127.0.0.1:8082"
	cfg.Runner.ServerID = "dev"
	cfg.Runner.AllowUnauthenticated = true
	// The console opens without sign-in on loopback, like the services it
	// shows; its knowledge-graph search asks as a reviewing agent of the
	// built-in registry.
	cfg.Console.HTTPAddr = "127.0.0.1:8090"
	cfg.Console.AllowUnauthenticated = true
	cfg.Console.LibrarianAgentID = "gemini-pro"
	// Agent types under the librarian permission policy ask this process's
	// Librarian and hear its decisions on this process's bus (the
	// addresses bound are given once they listen; these are the defaults).
	cfg.Runner.LibrarianURL = "http://127.0.0.1:8081"
	cfg.Runner.BusURL = "ws://127.0.0.1:7892"
	// So do the bridge's governed tools (at the default addresses).
	cfg.Bridge.LibrarianURL = "http://127.0.0.1:8081"
	cfg.Bridge.BusURL = "ws://127.0.0.1:7892"
	// Agents may work anywhere under the directory conclave dev runs in;
	// those the bus's default handler launches work in it.
	if wd, err := os.Getwd(); err == nil {
		cfg.Runner.WorkspaceRoots = []string{wd}
		cfg.Bus.Workspace = wd
	}
	if err := config.Load(ctx, &cfg, "conclave dev", args, lookup, stderr); err != nil {
		return err
	}
	if cfg.Storage.Backend != config.BackendEmbedded {
		return fmt.Errorf("CONCLAVE_BACKEND: conclave dev runs on the embedded backend; run the services themselves for %q", cfg.Storage.Backend)
	}
	if cfg.Runner.AgentTypesFile == "" {
		file, err := exampleAgentTypes(cfg.Storage.DataDir)
		if err != nil {
			return fmt.Errorf("the example agent type: %w", err)
		}
		cfg.Runner.AgentTypesFile = file
	}
	// One file holds every service's tables, and one every service's
	// queues; both survive restarts.
	backends, err := startup.Open(ctx, startup.Options{Name: "conclave", TelemetryName: "conclave", Version: versionString(),
		Common: cfg.Common, Storage: cfg.Storage, Logs: stderr,
		Tables: slices.Concat(gateway.Tables, librarian.Tables, bus.Tables, runner.Tables),
		Queue:  true, Queues: slices.Concat(bus.Queues(cfg.Bus), librarian.Queues(cfg.Librarian), runner.Queues(cfg.Runner))})
	if err != nil {
		return err
	}
	defer backends.Close()
	logger, tel, st, q := backends.Logger, backends.Telemetry, backends.Store, backends.Queue

	gw, err := gateway.New(cfg.Gateway, gateway.Deps{Store: st, Logger: logger, Telemetry: tel})
	if err != nil {
		return err
	}
	// The runner's governed agent types are registered with the Librarian,
	// as an operator registers them in agents.yaml (docs/governance.md).
	governed, err := runner.GovernedTypes(cfg.Runner)
	if err != nil {
		return err
	}
	lib, err := librarian.New(cfg.Librarian, librarian.Deps{Store: st, Queue: q, Logger: logger, Telemetry: tel,
		Agents: append(governed, cfg.Bridge.LibrarianAgent)})
	if err != nil {
		return err
	}
	// The runner registers the agents that ask for it at this gateway,
	// dialled once it listens, unless CONCLAVE_RUNNER_GATEWAY_ADDR names
	// another.
	var dialGateway []grpc.DialOption
	if cfg.Runner.GatewayAddr == "" {
		cfg.Runner.GatewayAddr = "passthrough:///conclave-dev-gateway"
		dialGateway = append(dialGateway, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			select {
			case <-gw.Ready():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", gw.Endpoints()[0].Address) // its gRPC listener
		}))
	}
	var b *bus.Bus
	rn, err := runner.New(cfg.Runner, runner.Deps{Store: st, Queue: q, Logger: logger, Telemetry: tel,
		ProcessDir:         filepath.Join(cfg.Storage.DataDir, runner.ProcessDirName),
		GatewayDialOptions: dialGateway,
		LibrarianURL:       func() string { return readyURL(lib, "http://", "HTTP") },
		BusURL: func() string {
			if b == nil {
				return ""
			}
			return readyURL(b, "ws://", "WebSocket")
		}})
	if err != nil {
		return err
	}
	// Given an agent type to launch (--bus-runner-agent-type), the bus's
	// default handler launches agents through this runner, dialled once it
	// listens, unless --bus-runner-addr names another. Without one, a
	// message no subscriber matches is answered with success false.
	var dialRunner []grpc.DialOption
	if cfg.Bus.RunnerAgentType != "" && cfg.Bus.RunnerAddr == "" {
		cfg.Bus.RunnerAddr = string(cfg.Runner.GRPCAddr)
		dialRunner = append(dialRunner, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			select {
			case <-rn.Ready():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", rn.Endpoints()[0].Address) // its gRPC listener
		}))
	}
	launcher, runnerConn, err := bus.RunnerLauncher(cfg.Bus, tel, dialRunner...)
	if err != nil {
		return err
	}
	defer runnerConn.Close()
	if b, err = bus.New(cfg.Bus, bus.Deps{Store: st, Queue: q, Logger: logger, Telemetry: tel, Launcher: launcher}); err != nil {
		return err
	}
	// The console reaches the others through their public APIs, at the
	// addresses they bind (port 0 in tests), known once each is ready.
	con, err := console.New(cfg.Console, console.Deps{Logger: logger, Telemetry: tel, Backends: func() console.Backends {
		return console.Backends{
			GatewayURL:   readyURL(gw, "http://", "HTTP"),
			BusURL:       readyURL(b, "ws://", "WebSocket"),
			RunnerURL:    readyURL(rn, "http://", "HTTP"),
			LibrarianURL: readyURL(lib, "http://", "HTTP"),
		}
	}})
	if err != nil {
		return err
	}
	services := []service{gw, lib, b, rn, con}
	if _, err := os.Stat(cfg.Bridge.ConfigFile); err != nil && cfg.Bridge.ConfigFile == exampleToolAgents {
		// Run outside the repository: there are no example tool agents to
		// serve, which is no reason to stop the rest.
		logger.WarnContext(ctx, "the bridge is not started: no tool agents configured; set CONCLAVE_BRIDGE_CONFIG to a config.yaml", "looked_for", exampleToolAgents)
	} else {
		cfg.Bridge.Env, cfg.Bridge.Version = lookup, versionString()
		br, err := bridge.New(cfg.Bridge, bridge.Deps{Logger: logger, Telemetry: tel})
		if err != nil {
			return err
		}
		services = append(services, br)
	}

	g, gctx := errgroup.WithContext(ctx)
	for _, s := range services {
		g.Go(func() error { return s.Run(gctx) })
	}
	g.Go(func() error {
		for _, s := range services {
			select {
			case <-s.Ready():
			case <-gctx.Done():
				return nil
			}
		}
		printEndpoints(stdout, services)
		logger.InfoContext(gctx, "conclave dev is running; press Ctrl-C to stop")
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	logger.InfoContext(context.WithoutCancel(ctx), "conclave dev stopped")
	return nil
}

// readyURL is scheme and the address of s's endpoint whose protocol starts
// with protocol, or "" while s is not ready.
func readyURL(s service, scheme, protocol string) string {
	select {
	case <-s.Ready():
	default:
		return ""
	}
	for _, e := range s.Endpoints() {
		if strings.HasPrefix(e.Protocol, protocol) && e.Address != "" {
			return scheme + e.Address
		}
	}
	return ""
}

func printEndpoints(w io.Writer, services []service) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tADDRESS\tSERVES")
	for _, s := range services {
		for _, e := range s.Endpoints() {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Service, e.Address, e.Protocol)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(w) // an empty line ends the table, for programs reading it
}
