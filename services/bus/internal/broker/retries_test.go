package broker

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// TestRedriveContinuesTheMessagesTrace: a dead letter keeps the trace
// context of its message, and a redrive, whatever trace its request is in,
// puts the message back on the retry queue in the message's own trace (a
// "bus redrive" span there, linked to the request's span), so that the
// redelivery is in the trace of the publish, the attempts and the dead
// letter (found by the end-to-end scenario: it was in the trace of the
// redrive's request, or a new one).
func TestRedriveContinuesTheMessagesTrace(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := store.EnsureTables(ctx, st, DeadLetterTable); err != nil {
		t.Fatal(err)
	}
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queue.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Ensure(ctx, RetryQueue); err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tracer := tp.Tracer("test")
	logger := slog.New(slog.DiscardHandler)
	r := NewRetries(q, st, RetryPolicy{MaxAttempts: 1}, tp, logger)
	New(Options{ServerID: "test", Retries: r, Logger: logger})

	// A message published in one trace runs out of attempts.
	pubCtx, pub := tracer.Start(ctx, "publish")
	job := retryJob{MessageID: "m-1", Topic: "agent:x", Payload: json.RawMessage(`{"type":"task"}`), ClientID: "x", Attempts: 1}
	if _, err := r.schedule(pubCtx, job, 0); err != nil {
		t.Fatal(err)
	}
	pub.End()
	dls, _, err := r.ListDeadLetters(ctx, 10, "")
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %+v (%v)", dls, err)
	}
	want := pub.SpanContext().TraceID()
	if dls[0].Traceparent == "" || dls[0].Traceparent[3:35] != want.String() {
		t.Fatalf("the dead letter's traceparent %q, want one in trace %s", dls[0].Traceparent, want)
	}

	// An operator redrives it from a request in another trace.
	opCtx, op := tracer.Start(ctx, "redrive request")
	if err := r.Redrive(opCtx, dls[0].ID); err != nil {
		t.Fatal(err)
	}
	op.End()
	msgs, err := q.Receive(ctx, RetryQueue.Name, queue.ReceiveOptions{Max: 1})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the retry queue holds %v (%v)", msgs, err)
	}
	if got := trace.SpanContextFromContext(msgs[0].TraceContext(ctx)).TraceID(); got != want {
		t.Errorf("the redriven message is in trace %s, want the message's %s", got, want)
	}
	var redrive sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "bus redrive" {
			redrive = s
		}
	}
	if redrive == nil {
		t.Fatal("no bus redrive span")
	}
	if redrive.SpanContext().TraceID() != want || redrive.Parent().SpanID() != pub.SpanContext().SpanID() {
		t.Errorf("bus redrive is in trace %s under %s, want under the publish %s", redrive.SpanContext().TraceID(), redrive.Parent().SpanID(), pub.SpanContext().SpanID())
	}
	if links := redrive.Links(); len(links) != 1 || links[0].SpanContext.SpanID() != op.SpanContext().SpanID() {
		t.Errorf("bus redrive links %+v, want the redrive request's span", links)
	}
}
