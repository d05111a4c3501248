// Command bus runs the WebSocket JSON-RPC agent bus (seed 004).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/services/bus/service"
)

type appConfig struct {
	config.Common
	Storage config.Storage
	Bus     service.Config
	// TablePrefix separates environments sharing one AWS account.
	TablePrefix string `env:"CONCLAVE_TABLE_PREFIX" default:"conclave-" help:"prefix of the DynamoDB table names"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, config.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bus:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "bus", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	logger := cfg.Logger(os.Stderr, "bus")
	tel, stopTelemetry, err := cfg.Telemetry(ctx, "conclave-bus", "")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	st, err := store.Open(ctx, cfg.Storage, cfg.TablePrefix)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		return err
	}
	q, err := queue.Open(ctx, cfg.Storage)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := service.EnsureQueues(ctx, q); err != nil {
		return err
	}
	// The runner's launch API is not wired yet: without a launcher, a
	// message no subscriber matches is answered with success false.
	bus, err := service.New(cfg.Bus, logger, tel, st, q, nil)
	if err != nil {
		return err
	}
	return bus.Run(ctx)
}
