package testenv

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// AWSConfig is what a service would load, with fixed test credentials (the
// local servers accept any) and nothing read from the environment, so a
// developer's real AWS settings never reach a test.
func AWSConfig() aws.Config {
	return aws.Config{
		Region: "us-east-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "testenv"}, nil
		}),
	}
}

// DynamoDBClient is a DynamoDB client for the server at endpoint (dynalite).
func DynamoDBClient(endpoint string) *dynamodb.Client {
	return dynamodb.NewFromConfig(AWSConfig(), func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(endpoint) })
}

// AWSBackends are dynalite and fauxqs, started for one test.
type AWSBackends struct {
	// Dynalite and Fauxqs are their own base URLs.
	Dynalite, Fauxqs string
	// Endpoint answers for both (AWSEndpoint); serve it where the
	// deployables under test reach it.
	Endpoint http.Handler
}

// StartAWS starts dynalite and fauxqs for t, stopped when it ends, and
// their shared endpoint.
func StartAWS(t testing.TB, ctx context.Context) *AWSBackends {
	t.Helper()
	dynalite, err := Dynalite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dynalite.Stop)
	fauxqs, err := Fauxqs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fauxqs.Stop)
	h, err := AWSEndpoint(dynalite.Endpoint, fauxqs.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return &AWSBackends{Dynalite: dynalite.Endpoint, Fauxqs: fauxqs.Endpoint, Endpoint: h}
}

// AWSEndpoint answers DynamoDB and SQS at one endpoint, as
// CONCLAVE_AWS_ENDPOINT wants (the services' store and queue share it): a
// request goes to dynalite or to fauxqs (their base URLs) by its
// X-Amz-Target, where the AWS SDK's JSON protocol names the service. Serve
// it on a listener of the test's.
func AWSEndpoint(dynalite, fauxqs string) (http.Handler, error) {
	proxy := func(target string) (*httputil.ReverseProxy, error) {
		u, err := url.Parse(target)
		if err != nil {
			return nil, err
		}
		return &httputil.ReverseProxy{
			Rewrite: func(r *httputil.ProxyRequest) {
				r.SetURL(u)
				// fauxqs builds queue URLs from the Host the client used.
				r.Out.Host = r.In.Host
			},
			// A client gone mid-request (an SQS long poll as a process
			// stops) is no failure of the test's: no log line for it.
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				w.WriteHeader(http.StatusBadGateway)
			},
		}, nil
	}
	dynamo, err := proxy(dynalite)
	if err != nil {
		return nil, err
	}
	sqs, err := proxy(fauxqs)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch target := r.Header.Get("X-Amz-Target"); {
		case strings.HasPrefix(target, "DynamoDB_"):
			dynamo.ServeHTTP(w, r)
		case strings.HasPrefix(target, "AmazonSQS."):
			sqs.ServeHTTP(w, r)
		default:
			http.Error(w, fmt.Sprintf("X-Amz-Target %q is neither DynamoDB nor SQS", target), http.StatusBadRequest)
		}
	}), nil
}
