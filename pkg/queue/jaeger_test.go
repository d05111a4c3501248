package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// tracerFor exports spans of one service to Jaeger over OTLP, as a deployed
// service would.
func tracerFor(t *testing.T, j *testenv.Jaeger, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(j.OTLPEndpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))),
	)
}

// TestQueueHopIsOneTraceInJaeger sends a message from a producer service
// through SQS (fauxqs) to a consumer service and finds both spans in one
// trace in a real Jaeger, the consumer's a child of the producer's.
func TestQueueHopIsOneTraceInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger and uses fauxqs")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j := testenv.JaegerFor(t)

	producer, consumer := tracerFor(t, j, "queue-producer"), tracerFor(t, j, "queue-consumer")
	defer producer.Shutdown(context.Background())
	defer consumer.Shutdown(context.Background())

	q := queue.NewSQS(testenv.AWSConfig(), fauxqs.Endpoint)
	if err := q.Ensure(ctx, queue.Definition{Name: "trace-hop", VisibilityTimeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	sendCtx, send := producer.Tracer("producer").Start(ctx, "publish event", trace.WithSpanKind(trace.SpanKindProducer))
	if _, err := q.Send(sendCtx, "trace-hop", queue.Outgoing{Body: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	send.End()
	traceID := send.SpanContext().TraceID().String()

	consumeCtx, stop := context.WithCancel(ctx)
	handled := make(chan string, 1)
	go func() {
		err := queue.Consume(consumeCtx, q, "trace-hop", func(ctx context.Context, m queue.Message) error {
			handled <- trace.SpanContextFromContext(ctx).TraceID().String()
			return nil
		}, queue.ConsumerOptions{Workers: 1, TracerProvider: consumer})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	select {
	case got := <-handled:
		if got != traceID {
			t.Fatalf("consumer ran in trace %s, want %s", got, traceID)
		}
	case <-ctx.Done():
		t.Fatal("message never consumed")
	}
	stop()

	tr, err := j.WaitTrace(ctx, traceID, 2)
	if err != nil {
		t.Fatal(err)
	}
	pub := tr.Span("publish event")
	var proc *testenv.JaegerSpan
	for i := range tr.Spans {
		if tr.Spans[i].ServiceName == "queue-consumer" {
			proc = &tr.Spans[i]
		}
	}
	if pub == nil || proc == nil {
		t.Fatalf("trace %s lacks the producer or consumer span: %+v", traceID, tr.Spans)
	}
	if pub.ServiceName != "queue-producer" || proc.ParentSpanID != pub.SpanID {
		t.Fatalf("consumer span %s (service %s) has parent %s, want the producer span %s", proc.OperationName, proc.ServiceName, proc.ParentSpanID, pub.SpanID)
	}
}
