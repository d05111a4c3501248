// Command gateway runs the coven agent gateway (seed 001).
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

type appConfig struct {
	config.Common
	Storage config.Storage
	Gateway service.Config
	// TablePrefix separates environments sharing one AWS account.
	TablePrefix string `env:"CONCLAVE_TABLE_PREFIX" default:"conclave-" help:"prefix of the DynamoDB table names"`
}

func main() { config.Main("gateway", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "gateway", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	logger := cfg.Logger(os.Stderr, "gateway")
	tel, stopTelemetry, err := telemetry.Start(ctx, cfg.Common, "conclave-gateway", "")
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
	gw, err := service.New(cfg.Gateway, logger, tel, st)
	if err != nil {
		return err
	}
	return gw.Run(ctx)
}
