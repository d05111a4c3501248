// Package lambdafn is the Librarian Lambda's cold start: settings from the
// environment, the DynamoDB store and SQS queue clients (traced with
// otelaws), the handler, and the API Gateway adapter traced with
// otellambda. It makes no network call: clients connect on first use, and
// the tables and queue are created by infra/, not here. It imports only
// what a Lambda runs: internal/handler rather than package service (which
// links pkg/server and gRPC), and its own OTLP/HTTP telemetry rather than
// pkg/telemetry (Prometheus, OTLP/gRPC).
package lambdafn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"go.opentelemetry.io/contrib/instrumentation/github.com/aws/aws-lambda-go/otellambda"
	"go.opentelemetry.io/contrib/instrumentation/github.com/aws/aws-sdk-go-v2/otelaws"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/conclave-ai/conclave/functions/librarian/internal/apigw"
	"github.com/conclave-ai/conclave/functions/librarian/internal/handler"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// Settings are the Lambda's environment.
type Settings struct {
	config.Common
	Storage   config.Storage
	Librarian handler.Config
	// QueueEndpoint overrides SQS alone, for a local SQS beside a local
	// DynamoDB on another port.
	QueueEndpoint string `env:"CONCLAVE_LIBRARIAN_QUEUE_ENDPOINT" help:"override the SQS endpoint only (default: CONCLAVE_AWS_ENDPOINT)"`
	OTLP          OTLPSettings
}

// Validate implements config.Validator.
func (s Settings) Validate() error {
	if s.Storage.Backend != config.BackendAWS {
		return fmt.Errorf("CONCLAVE_BACKEND: the Lambda keeps its state in DynamoDB; set it to aws (got %q)", s.Storage.Backend)
	}
	if s.OTLPEndpoint != "" {
		if _, err := otlpHTTPBase(s.OTLPEndpoint, s.OTLPInsecure); err != nil {
			return err
		}
	}
	return nil
}

// awsConfig builds the AWS clients' configuration from the credentials
// Lambda hands a function in its environment (its execution role's:
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, valid for
// the execution environment's life). It does not fall back to
// aws-sdk-go-v2/config's default chain (shared files, profiles, SSO): none
// of it applies in Lambda, and linking that package alone costs every cold
// start the initialization of the SSO, SSO-OIDC, STS and sign-in clients.
// A local run uses functions/librarian/cmd/local, which keeps the chain.
func awsConfig(lookup config.Lookup, region string) (aws.Config, error) {
	id, _ := lookup("AWS_ACCESS_KEY_ID")
	secret, _ := lookup("AWS_SECRET_ACCESS_KEY")
	if id == "" || secret == "" {
		return aws.Config{}, errors.New("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set: Lambda sets them from the execution role " +
			"(run the Librarian elsewhere with functions/librarian/cmd/local, which reads the SDK's default credential chain)")
	}
	token, _ := lookup("AWS_SESSION_TOKEN")
	return aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider(id, secret, token)}, nil
}

// Init builds the Lambda handler; stop flushes telemetry.
func Init(ctx context.Context, lookup config.Lookup, stderr io.Writer) (lambdaHandler any, stop func(), err error) {
	var s Settings
	// Lambda logs are read by machines: JSON by default.
	if err := config.Load(ctx, &s, "librarian", nil, lookup, stderr); err != nil {
		return nil, nil, err
	}
	logger := s.Logger(stderr, "librarian")
	tel, err := newLambdaTelemetry(ctx, s.Common, s.OTLP, "conclave-librarian")
	if err != nil {
		return nil, nil, err
	}
	awsCfg, err := awsConfig(lookup, s.Storage.AWSRegion)
	if err != nil {
		tel.stop()
		return nil, nil, fmt.Errorf("AWS configuration: %w", err)
	}
	otelaws.AppendMiddlewares(&awsCfg.APIOptions, otelaws.WithTracerProvider(tel.tracerProvider),
		otelaws.WithTextMapPropagator(propagation.TraceContext{}))
	ddb := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if s.Storage.AWSEndpoint != "" {
			o.BaseEndpoint = aws.String(s.Storage.AWSEndpoint)
		}
	})
	st := store.NewDynamo(ddb, store.DynamoOptions{TablePrefix: s.Storage.TablePrefix, Endpoint: s.Storage.AWSEndpoint})
	queueEndpoint := s.QueueEndpoint
	if queueEndpoint == "" {
		queueEndpoint = s.Storage.AWSEndpoint
	}
	q := queue.NewSQS(awsCfg, queueEndpoint)
	lib, err := handler.New(s.Librarian, handler.Deps{Store: st, Queue: q, Logger: logger, Meters: tel.meterProvider, AwaitOutboxClear: true,
		Instrument: func(h http.Handler) http.Handler {
			opts := []otelhttp.Option{otelhttp.WithTracerProvider(tel.tracerProvider), otelhttp.WithPropagators(tel.propagator)}
			if tel.meterProvider != nil {
				opts = append(opts, otelhttp.WithMeterProvider(tel.meterProvider))
			}
			return otelhttp.NewHandler(h, "librarian", opts...)
		}})
	if err != nil {
		tel.stop()
		return nil, nil, err
	}
	// A frozen execution environment must not hold spans or metrics back.
	return otellambda.InstrumentHandler(withSchedule(apigw.Handler(lib.Handler), lib.SweepEscalations, logger), otellambda.WithTracerProvider(tel.tracerProvider),
		otellambda.WithPropagator(propagation.TraceContext{}), otellambda.WithEventToCarrier(apigw.EventCarrier),
		otellambda.WithFlusher(tel)), tel.stop, nil
}
