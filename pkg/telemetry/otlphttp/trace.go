package otlphttp

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// NewTraceExporter exports spans to cfg.Endpoint + /v1/traces. The SDK's
// otlptrace turns spans into the OTLP messages; this package only sends
// them.
func NewTraceExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	s, err := newSender(cfg, "/v1/traces")
	if err != nil {
		return nil, err
	}
	return otlptrace.New(ctx, traceClient{s})
}

// traceClient is otlptrace's transport.
type traceClient struct{ s *sender }

func (traceClient) Start(context.Context) error { return nil }

func (c traceClient) Stop(context.Context) error {
	c.s.shutdown()
	return nil
}

func (c traceClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	body, err := encode(spans)
	if err != nil {
		return err
	}
	return c.s.send(ctx, body)
}
