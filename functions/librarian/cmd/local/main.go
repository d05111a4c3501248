// Command local serves the Librarian's handler over plain HTTP on :8081,
// on the embedded store and queue (or DynamoDB and SQS with
// CONCLAVE_BACKEND=aws): the Lambda without API Gateway.
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/startup"
)

type appConfig struct {
	config.Common
	Storage   config.Storage
	Librarian service.Config
}

func main() { config.Main("librarian", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "librarian", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	b, err := startup.Open(ctx, startup.Options{Name: "librarian", Common: cfg.Common, Storage: cfg.Storage, Logs: os.Stderr,
		Tables: service.Tables, Queue: true, Queues: service.Queues(cfg.Librarian)})
	if err != nil {
		return err
	}
	defer b.Close()
	svc, err := service.New(cfg.Librarian, service.Deps{Store: b.Store, Queue: b.Queue, Logger: b.Logger, Telemetry: b.Telemetry})
	if err != nil {
		return err
	}
	return svc.Run(ctx)
}
