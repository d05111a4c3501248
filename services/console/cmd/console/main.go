// Command console runs Conclave's web console: agents and chat, bus topics
// and dead letters, runner instances and logs, Librarian reviews.
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/console/service"
)

type appConfig struct {
	config.Common
	Console service.Config
}

func main() { config.Main("console", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "console", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	logger := cfg.Logger(os.Stderr, "console")
	tel, stopTelemetry, err := telemetry.Start(ctx, cfg.Common, "conclave-console", "")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	c, err := service.New(cfg.Console, service.Deps{Logger: logger, Telemetry: tel})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
