package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestDynamoExpiredCredentialsNamesTableAndEndpoint uses credentials that
// can no longer be refreshed, as happens when a session token expires: the
// error must say which table and endpoint the failed call was for.
func TestDynamoExpiredCredentialsNamesTableAndEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("needs dynalite")
	}
	t.Parallel()
	cfg := testenv.AWSConfig()
	cfg.Credentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{}, errors.New("the security token included in the request is expired")
	})
	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(dynalite.Endpoint) })
	s := store.NewDynamo(client, store.DynamoOptions{TablePrefix: "creds-", Endpoint: dynalite.Endpoint})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.Get(ctx, "agents", store.Key{PK: "p", SK: "s"})
	if err == nil {
		t.Fatal("a call with expired credentials succeeded")
	}
	for _, want := range []string{"creds-agents", dynalite.Endpoint, "expired"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
