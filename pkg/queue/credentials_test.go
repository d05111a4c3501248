package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestSQSExpiredCredentialsNamesQueueAndEndpoint uses credentials that can no
// longer be refreshed: the error must say which queue and endpoint the failed
// call was for.
func TestSQSExpiredCredentialsNamesQueueAndEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("needs fauxqs")
	}
	t.Parallel()
	cfg := testenv.AWSConfig()
	cfg.Credentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
		return aws.Credentials{}, errors.New("the security token included in the request is expired")
	})
	q := queue.NewSQS(cfg, fauxqs.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := q.Send(ctx, "orders", queue.Outgoing{Body: []byte("x")})
	if err == nil {
		t.Fatal("a call with expired credentials succeeded")
	}
	for _, want := range []string{"orders", fauxqs.Endpoint, "expired"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
