package service

import (
	"context"
	"io"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bus/internal/bubcli"
)

type appConfig struct {
	config.Common
	Storage config.Storage
	Bus     Config
	// TablePrefix separates environments sharing one AWS account.
	TablePrefix string `env:"CONCLAVE_TABLE_PREFIX" default:"conclave-" help:"prefix of the DynamoDB table names"`
}

// Serve loads the bus's settings from args and lookup, opens its store and
// queue, and runs it until ctx ends: the body of cmd/bus and `bub serve`.
func Serve(ctx context.Context, name string, args []string, lookup config.Lookup, stderr io.Writer) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, name, args, lookup, stderr); err != nil {
		return err
	}
	logger := cfg.Logger(stderr, "bus")
	tel, stopTelemetry, err := telemetry.Start(ctx, cfg.Common, "conclave-bus", "")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	st, err := store.Open(ctx, cfg.Storage, cfg.TablePrefix)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := store.EnsureTables(ctx, st, Tables...); err != nil {
		return err
	}
	q, err := queue.Open(ctx, cfg.Storage)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := EnsureQueues(ctx, q); err != nil {
		return err
	}
	launcher, runnerConn, err := RunnerLauncher(cfg.Bus, tel)
	if err != nil {
		return err
	}
	defer runnerConn.Close()
	bus, err := New(cfg.Bus, logger, tel, st, q, launcher)
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
