package service

import (
	"context"
	"io"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/startup"
	"github.com/conclave-ai/conclave/services/bus/internal/bubcli"
)

type appConfig struct {
	config.Common
	Storage config.Storage
	Bus     Config
}

// Serve loads the bus's settings from args and lookup, opens its store and
// queue, and runs it until ctx ends: the body of cmd/bus and `bub serve`.
func Serve(ctx context.Context, name string, args []string, lookup config.Lookup, stderr io.Writer) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, name, args, lookup, stderr); err != nil {
		return err
	}
	b, err := startup.Open(ctx, startup.Options{Name: "bus", Common: cfg.Common, Storage: cfg.Storage, Logs: stderr,
		Tables: Tables, Queue: true, Queues: Queues(cfg.Bus)})
	if err != nil {
		return err
	}
	defer b.Close()
	launcher, runnerConn, err := RunnerLauncher(cfg.Bus, b.Telemetry)
	if err != nil {
		return err
	}
	defer runnerConn.Close()
	bus, err := New(cfg.Bus, Deps{Store: b.Store, Queue: b.Queue, Logger: b.Logger, Telemetry: b.Telemetry, Launcher: launcher})
	if err != nil {
		return err
	}
	return bus.Run(ctx)
}

// CLI runs one bub command (send-message, subscribe, dlq, serve), for
// cmd/bub and `conclave bus`. It reads BUB_BUS_URL, BUB_DEFAULT_TOPIC,
// BUB_AGENT_ID and BUB_TOKEN through lookup.
func CLI(ctx context.Context, name string, args []string, lookup config.Lookup, stdin io.Reader, stdout, stderr io.Writer) error {
	return bubcli.Run(ctx, args, bubcli.Env{
		Name: name, Lookup: lookup, Stdin: stdin, Stdout: stdout, Stderr: stderr,
		Serve: func(ctx context.Context, args []string) error {
			return Serve(ctx, name+" serve", args, lookup, stderr)
		},
	})
}
