package otlphttp_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/conclave-ai/conclave/pkg/telemetry/otlphttp"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestSpansReachJaeger: spans this exporter sends, plain and gzipped, are
// found through a real Jaeger's query API, with their service and parent.
func TestSpansReachJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Jaeger")
	}
	t.Parallel()
	jaeger := testenv.JaegerFor(t)
	for _, gz := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		exp, err := otlphttp.NewTraceExporter(ctx, otlphttp.Config{Endpoint: "http://" + jaeger.OTLPHTTPEndpoint, Gzip: gz,
			Headers: map[string]string{"X-Tenant": "conclave"}})
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "otlphttp-test"))))
		tracer := tp.Tracer("otlphttp")
		rctx, root := tracer.Start(ctx, "root")
		_, child := tracer.Start(rctx, "child")
		child.SetAttributes(attribute.Bool("gzip", gz), attribute.StringSlice("tags", []string{"a", "b"}))
		child.End()
		root.End()
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatalf("gzip %v: flushing to Jaeger: %v", gz, err)
		}
		trace, err := jaeger.WaitTrace(ctx, root.SpanContext().TraceID().String(), 2)
		if err != nil {
			t.Fatalf("gzip %v: waiting for the trace in Jaeger: %v", gz, err)
		}
		r, c := trace.Span("root"), trace.Span("child")
		if r == nil || c == nil {
			t.Fatalf("gzip %v: trace %+v lacks root or child", gz, trace)
		}
		if c.ParentSpanID != r.SpanID || r.ServiceName != "otlphttp-test" || c.Tags["gzip"] != gz {
			t.Errorf("gzip %v: child %+v of root %+v", gz, c, r)
		}
	}
}
