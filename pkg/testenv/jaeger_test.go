package testenv_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// tracerProvider exports every span at once over OTLP gRPC to endpoint, as
// the named service.
func tracerProvider(t *testing.T, ctx context.Context, endpoint, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// TestJaeger sends a parent span from one service and its child from another,
// the context crossing between them as a W3C traceparent, to a real Jaeger
// over OTLP gRPC, and finds them as one trace through the query API.
func TestJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger")
	}
	t.Parallel()
	// Not under the deadline below: on a fresh clone StartJaeger builds the
	// binary first, which takes minutes.
	j, err := testenv.StartJaeger(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Stop)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	gateway := tracerProvider(t, ctx, j.OTLPEndpoint, "testenv-gateway")
	agent := tracerProvider(t, ctx, j.OTLPEndpoint, "testenv-agent")

	pctx, parent := gateway.Tracer("testenv").Start(ctx, "client.request", trace.WithSpanKind(trace.SpanKindClient))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(pctx, carrier)

	cctx := propagation.TraceContext{}.Extract(context.Background(), carrier)
	_, child := agent.Tracer("testenv").Start(cctx, "agent.handle",
		trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.String("agent.id", "a-1")))
	child.End()
	parent.End()

	traceID := parent.SpanContext().TraceID().String()
	got, err := j.WaitTrace(ctx, traceID, 2)
	if err != nil {
		t.Fatalf("%v\n%s", err, j.Output())
	}
	if got.TraceID != traceID {
		t.Errorf("trace id = %s, want %s", got.TraceID, traceID)
	}
	if len(got.Spans) != 2 {
		t.Fatalf("trace has %d spans, want 2: %+v", len(got.Spans), got.Spans)
	}
	p, c := got.Span("client.request"), got.Span("agent.handle")
	if p == nil || c == nil {
		t.Fatalf("spans = %+v", got.Spans)
	}
	if p.SpanID != parent.SpanContext().SpanID().String() || p.ServiceName != "testenv-gateway" || p.ParentSpanID != "" {
		t.Errorf("parent = %+v, want span %s of testenv-gateway with no parent", p, parent.SpanContext().SpanID())
	}
	if c.SpanID != child.SpanContext().SpanID().String() || c.ServiceName != "testenv-agent" {
		t.Errorf("child = %+v, want span %s of testenv-agent", c, child.SpanContext().SpanID())
	}
	if c.ParentSpanID != p.SpanID {
		t.Errorf("child's parent = %q, want %s (references %+v)", c.ParentSpanID, p.SpanID, c.References)
	}
	if c.Tags["agent.id"] != "a-1" || c.Tags["span.kind"] != "server" {
		t.Errorf("child tags = %v", c.Tags)
	}

	// A trace that never comes ends with the context, as an error.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := j.Trace(short, "0123456789abcdef0123456789abcdef"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("unknown trace: err = %v, want deadline exceeded", err)
	}
}
