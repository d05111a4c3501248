package lambdafn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/telemetry/otlphttp"
)

// lambdaTelemetry is the Lambda's tracing and metrics. It is not
// pkg/telemetry's Provider: a Lambda has no /metrics to scrape and no gRPC
// to instrument, and linking the Prometheus client, the OTLP/gRPC
// exporters and gRPC cost a third of its cold start. Both signals go over
// OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (in AWS, the collector extension
// on localhost:4318), and are flushed at the end of every invocation,
// because a frozen execution environment runs no background export.
type lambdaTelemetry struct {
	tracerProvider trace.TracerProvider
	// meterProvider is nil without an endpoint: nothing would read the
	// instruments.
	meterProvider metric.MeterProvider
	propagator    propagation.TextMapPropagator
	flushes       []func(context.Context) error
	shutdowns     []func(context.Context) error
}

// OTLPSettings are the OTLP/HTTP exporters' settings beyond the endpoint
// (config.Common's), with the OpenTelemetry specification's names.
type OTLPSettings struct {
	// Headers often hold a credential: they reach the requests only.
	Headers     otlphttp.Headers       `env:"OTEL_EXPORTER_OTLP_HEADERS" help:"headers of every OTLP request: key=value pairs, comma-separated, values percent-encoded"`
	Timeout     otlphttp.TimeoutMillis `env:"OTEL_EXPORTER_OTLP_TIMEOUT" help:"milliseconds each OTLP request may take (default 10000)"`
	Compression otlphttp.Compression   `env:"OTEL_EXPORTER_OTLP_COMPRESSION" help:"gzip or none"`
}

func newLambdaTelemetry(ctx context.Context, common config.Common, otlp OTLPSettings, service string) (*lambdaTelemetry, error) {
	t := &lambdaTelemetry{tracerProvider: noop.NewTracerProvider(),
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	if common.OTLPEndpoint != "" {
		base, err := otlpHTTPBase(common.OTLPEndpoint, common.OTLPInsecure)
		if err != nil {
			return nil, err
		}
		res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(service))
		cfg := otlphttp.Config{Endpoint: base, Headers: otlp.Headers, Gzip: otlp.Compression.Gzip(), Timeout: time.Duration(otlp.Timeout)}
		spans, err := otlphttp.NewTraceExporter(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(spans),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
		points, err := otlphttp.NewMetricExporter(cfg)
		if err != nil {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: metric exporter: %w", err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(sdkmetric.NewPeriodicReader(points)))
		t.tracerProvider, t.meterProvider = tp, mp
		// Spans first, so those recorded while metrics flush are not lost.
		t.flushes = []func(context.Context) error{tp.ForceFlush, mp.ForceFlush}
		t.shutdowns = []func(context.Context) error{tp.Shutdown, mp.Shutdown}
	}
	// Libraries that only consult the globals (pkg/queue's consumer) see
	// the same providers.
	otel.SetTracerProvider(t.tracerProvider)
	if t.meterProvider != nil {
		otel.SetMeterProvider(t.meterProvider)
	}
	otel.SetTextMapPropagator(t.propagator)
	return t, nil
}

// otlpHTTPBase is the collector's base URL from OTEL_EXPORTER_OTLP_ENDPOINT:
// a URL as the OpenTelemetry specification has it
// ("http://localhost:4318"), or host:port, over TLS unless insecure.
func otlpHTTPBase(raw string, insecure bool) (string, error) {
	if !strings.Contains(raw, "://") {
		scheme := "https://"
		if insecure {
			scheme = "http://"
		}
		raw = scheme + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %q is neither a URL nor host:port", raw)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %q: unsupported scheme %q (the Lambda exports OTLP over HTTP)", raw, u.Scheme)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// ForceFlush implements otellambda.Flusher: it sends the invocation's spans
// and metrics before Lambda freezes the environment.
func (t *lambdaTelemetry) ForceFlush(ctx context.Context) error {
	var errs []error
	for _, f := range t.flushes {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// stop flushes and releases the exporters within a bound of its own: Lambda
// gives a SIGTERM handler 500 ms.
func (t *lambdaTelemetry) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	for _, f := range t.shutdowns {
		_ = f(ctx)
	}
}
