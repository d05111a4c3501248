// Command gateway runs the coven agent gateway (the coven protocol).
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/startup"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

type appConfig struct {
	config.Common
	Storage config.Storage
	Gateway service.Config
}

func main() { config.Main("gateway", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "gateway", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	b, err := startup.Open(ctx, startup.Options{Name: "gateway", Common: cfg.Common, Storage: cfg.Storage, Logs: os.Stderr,
		Tables: service.Tables})
	if err != nil {
		return err
	}
	defer b.Close()
	gw, err := service.New(cfg.Gateway, service.Deps{Store: b.Store, Logger: b.Logger, Telemetry: b.Telemetry})
	if err != nil {
		return err
	}
	return gw.Run(ctx)
}
