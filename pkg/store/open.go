package store

import (
	"net/http"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

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
