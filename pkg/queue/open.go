package queue

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/conclave-ai/conclave/pkg/config"
)

// Opened is a Queue with the resources behind it, released by Close.
type Opened interface {
	Queue
	io.Closer
}

// Open opens the backend the settings name: the embedded file
// <DataDir>/queues.db, or SQS with the AWS SDK's default credential chain
// (and CONCLAVE_AWS_ENDPOINT, for fauxqs). Only a main calls it: it reads
// the AWS environment.
func Open(ctx context.Context, s config.Storage) (Opened, error) {
	switch s.Backend {
	case config.BackendEmbedded:
		if err := os.MkdirAll(s.DataDir, 0o755); err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		return OpenEmbedded(filepath.Join(s.DataDir, "queues.db"))
	case config.BackendAWS:
		cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(s.AWSRegion))
		if err != nil {
			return nil, fmt.Errorf("queue: AWS configuration: %w", err)
		}
		return sqsCloser{NewSQS(cfg, s.AWSEndpoint)}, nil
	}
	return nil, fmt.Errorf("queue: unknown backend %q", s.Backend)
}

// sqsCloser gives SQS, which holds nothing to release, a Close.
type sqsCloser struct{ *SQS }

func (sqsCloser) Close() error { return nil }
