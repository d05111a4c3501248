package store

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/conclave-ai/conclave/pkg/config"
)

// Open opens the backend the settings name: the embedded file
// <DataDir>/state.db, or DynamoDB with the AWS SDK's default credential
// chain (and CONCLAVE_AWS_ENDPOINT, for dynalite), its tables named with
// TablePrefix. Only a main calls it: it reads the AWS environment.
func Open(ctx context.Context, s config.Storage) (Store, error) {
	switch s.Backend {
	case config.BackendEmbedded:
		return OpenBolt(filepath.Join(s.DataDir, "state.db"), BoltOptions{})
	case config.BackendAWS:
		cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(s.AWSRegion), awsconfig.WithHTTPClient(HTTPClient()))
		if err != nil {
			return nil, fmt.Errorf("store: AWS configuration: %w", err)
		}
		client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
			if s.AWSEndpoint != "" {
				o.BaseEndpoint = aws.String(s.AWSEndpoint)
			}
		})
		return NewDynamo(client, DynamoOptions{TablePrefix: s.TablePrefix, Endpoint: s.AWSEndpoint}), nil
	}
	return nil, fmt.Errorf("store: unknown backend %q", s.Backend)
}

// MaxConnections bounds the connections the DynamoDB client opens. A burst
// of calls (thousands of agents registering at once after a replica
// restart) then waits for a connection, each call within its own deadline,
// rather than opening one connection per call; and the connections stay
// open for the next burst.
const MaxConnections = 64

// HTTPClient is the AWS SDK's HTTP client with MaxConnections.
func HTTPClient() *awshttp.BuildableClient {
	return awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxConnsPerHost = MaxConnections
		t.MaxIdleConnsPerHost = MaxConnections
	})
}
