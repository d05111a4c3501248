// Command local serves the Librarian's handler over plain HTTP on :8081,
// on the embedded store and queue (or DynamoDB and SQS with
// CONCLAVE_BACKEND=aws): the Lambda without API Gateway.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
)

type appConfig struct {
	config.Common
	Storage     config.Storage
	Librarian   service.Config
	TablePrefix string `env:"CONCLAVE_TABLE_PREFIX" default:"conclave-" help:"prefix of the DynamoDB table names"`
}

func main() { config.Main("librarian", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "librarian", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	logger := cfg.Logger(os.Stderr, "librarian")
	tel, stopTelemetry, err := telemetry.Start(ctx, cfg.Common, "conclave-librarian", "")
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
	q, closeQueue, err := openQueue(ctx, cfg.Storage)
	if err != nil {
		return err
	}
	defer closeQueue()
	for _, d := range service.Queues {
		if err := q.Ensure(ctx, d); err != nil {
			return err
		}
	}
	svc, err := service.New(cfg.Librarian, service.Deps{Store: st, Queue: q, Logger: logger, Telemetry: tel})
	if err != nil {
		return err
	}
	return svc.Run(ctx)
}

func openQueue(ctx context.Context, s config.Storage) (queue.Queue, func(), error) {
	if s.Backend == config.BackendEmbedded {
		q, err := queue.OpenEmbedded(filepath.Join(s.DataDir, "librarian-queue.db"))
		if err != nil {
			return nil, nil, err
		}
		return q, func() { _ = q.Close() }, nil
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(s.AWSRegion))
	if err != nil {
		return nil, nil, fmt.Errorf("AWS configuration: %w", err)
	}
	return queue.NewSQS(awsCfg, s.AWSEndpoint), func() {}, nil
}
