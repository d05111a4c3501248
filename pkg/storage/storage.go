// Package storage opens the store and queue backends a deployable's
// settings name, with the AWS SDK's default configuration (shared config
// and credentials files, profiles, SSO, the instance's role) for the aws
// backend. It is apart from pkg/store and pkg/queue so that a program that
// builds its AWS clients itself does not link aws-sdk-go-v2/config: the
// Librarian Lambda, whose credentials are in its environment, would
// otherwise pay the package initialization of the SSO, SSO-OIDC, STS and
// sign-in clients that package links on every cold start.
package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// OpenStore opens the store the settings name: the embedded file
// <DataDir>/state.db, or DynamoDB with the AWS SDK's default credential
// chain (and CONCLAVE_AWS_ENDPOINT, for dynalite), its tables named with
// TablePrefix. Only a main calls it: it reads the AWS environment.
func OpenStore(ctx context.Context, s config.Storage) (store.Store, error) {
	switch s.Backend {
	case config.BackendEmbedded:
		return store.OpenBolt(filepath.Join(s.DataDir, "state.db"), store.BoltOptions{})
	case config.BackendAWS:
		cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(s.AWSRegion), awsconfig.WithHTTPClient(store.HTTPClient()))
		if err != nil {
			return nil, fmt.Errorf("store: AWS configuration: %w", err)
		}
		client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
			if s.AWSEndpoint != "" {
				o.BaseEndpoint = aws.String(s.AWSEndpoint)
			}
		})
		return store.NewDynamo(client, store.DynamoOptions{TablePrefix: s.TablePrefix, Endpoint: s.AWSEndpoint}), nil
	}
	return nil, fmt.Errorf("store: unknown backend %q", s.Backend)
}

// OpenQueue opens the queue the settings name: the embedded file
// <DataDir>/queues.db, or SQS with the AWS SDK's default credential chain
// (and CONCLAVE_AWS_ENDPOINT, for fauxqs). Only a main calls it: it reads
// the AWS environment.
func OpenQueue(ctx context.Context, s config.Storage) (queue.Opened, error) {
	switch s.Backend {
	case config.BackendEmbedded:
		if err := os.MkdirAll(s.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		return queue.OpenEmbedded(filepath.Join(s.DataDir, "queues.db"))
	case config.BackendAWS:
		cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(s.AWSRegion))
		if err != nil {
			return nil, fmt.Errorf("queue: AWS configuration: %w", err)
		}
		return sqsCloser{queue.NewSQS(cfg, s.AWSEndpoint)}, nil
	}
	return nil, fmt.Errorf("queue: unknown backend %q", s.Backend)
}

// sqsCloser gives SQS, which holds nothing to release, a Close.
type sqsCloser struct{ *queue.SQS }

func (sqsCloser) Close() error { return nil }
