// Command bridge runs the tool bridge (docs/bridge.md): `bridge` serves MCP over
// streamable HTTP; `bridge run|list|health|diagnose|mcp` are the same
// commands as `conclave bridge`.
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bridge/service"
)

type appConfig struct {
	config.Common
	Bridge service.Config
}

func main() { config.Main("bridge", run) }

func run(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		return service.Main(ctx, "bridge", args, os.LookupEnv, service.IO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}, "dev")
	}
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "bridge", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	cfg.Bridge.Env = os.LookupEnv
	logger := cfg.Logger(os.Stderr, "bridge")
	tel, stopTelemetry, err := telemetry.Start(ctx, cfg.Common, "conclave-bridge", "")
	if err != nil {
		return err
	}
	defer stopTelemetry()
	b, err := service.New(cfg.Bridge, service.Deps{Logger: logger, Telemetry: tel})
	if err != nil {
		return err
	}
	return b.Run(ctx)
}
