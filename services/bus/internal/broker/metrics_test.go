package broker

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestDeliveryPathAllocations checks that what every delivery does besides
// its frame (its metrics, its span, the span lookups of the tracer and the
// trace propagation) stays off the allocator.
func TestDeliveryPathAllocations(t *testing.T) {
	type key struct{}
	m := nopMetrics()
	since := time.Now()
	tracer := noop.NewTracerProvider().Tracer("")
	ctx, span := tracer.Start(context.WithValue(context.Background(), key{}, 1), "bus publish")
	ctx = detach(ctx, span)
	var ans subscriberAnswer
	answer := []byte(`{"success":true,"processed":false}`) // a message would be a string to allocate
	tests := []struct {
		name string
		f    func()
	}{
		{"delivered", func() { m.delivered(ctx, MethodSendMessage, "answered") }},
		{"answered", func() { m.answered(ctx, MethodProcessMessage, since) }},
		{"decoding an answer", func() { _ = decodeAnswer(answer, &ans) }},
		{"span lookup under the detached context", func() { _ = trace.SpanContextFromContext(ctx) }},
	}
	for _, tt := range tests {
		if n := testing.AllocsPerRun(100, tt.f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", tt.name, n)
		}
	}
}
