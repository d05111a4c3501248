package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
)

// Event types the runner sends.
const (
	EventSessionUpdate = "runner.session.update"
	EventStatusChanged = "runner.task.status_changed"
)

type pendingEvent struct {
	ctx context.Context
	env *eventsv1.Envelope
}

// events sends envelopes to the events queue in order, in batches, from one
// goroutine, so that an agent's stream is never held up by a queue round
// trip per update. A failed send is retried until it succeeds or the runner
// shuts down: an acknowledged update is not dropped.
type events struct {
	q      queue.Queue
	queue  string
	source string
	log    *slog.Logger
	ch     chan pendingEvent
	done   chan struct{}
	// published counts envelopes sent, for metrics.
	published func(n int)
}

func newEvents(q queue.Queue, queueName, source string, logger *slog.Logger, published func(int)) *events {
	e := &events{q: q, queue: queueName, source: source, log: logger, ch: make(chan pendingEvent, 4096), done: make(chan struct{}), published: published}
	go e.run()
	return e
}

func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Publish queues an event about instanceID of taskID.
func (e *events) Publish(ctx context.Context, typ, taskID, instanceID string, payload map[string]any) {
	s, err := structpb.NewStruct(payload)
	if err != nil {
		e.log.WarnContext(ctx, "runner: an event payload is not representable", "type", typ, "error", err)
		return
	}
	packed, _ := anypb.New(s)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	env := &eventsv1.Envelope{
		Id: newEventID(), Type: typ, Source: e.source, Time: timestamppb.Now(),
		SubjectIds: map[string]string{"task_id": taskID, "instance_id": instanceID},
		Payload:    packed,
	}
	if carrier["traceparent"] != "" {
		env.TraceContext = &eventsv1.TraceContext{Traceparent: carrier["traceparent"], Tracestate: carrier["tracestate"]}
	}
	e.ch <- pendingEvent{ctx: context.WithoutCancel(ctx), env: env}
}

// Close sends what is queued, giving up after the deadline of ctx.
func (e *events) Close(ctx context.Context) {
	close(e.ch)
	select {
	case <-e.done:
	case <-ctx.Done():
		e.log.Warn("runner: events not sent before shutdown", "queued", len(e.ch))
	}
}

func (e *events) run() {
	defer close(e.done)
	for first := range e.ch {
		batch := []pendingEvent{first}
	fill:
		for len(batch) < queue.MaxBatch {
			select {
			case p, ok := <-e.ch:
				if !ok {
					break fill
				}
				batch = append(batch, p)
			default:
				break fill
			}
		}
		e.send(batch)
	}
}

func (e *events) send(batch []pendingEvent) {
	msgs := make([]queue.Outgoing, 0, len(batch))
	for _, p := range batch {
		body, err := queue.EncodeEnvelope(p.env)
		if err != nil {
			e.log.Warn("runner: encoding an event", "error", err)
			continue
		}
		msgs = append(msgs, queue.Outgoing{Body: body})
	}
	delay := 100 * time.Millisecond
	for len(msgs) > 0 {
		ctx, cancel := context.WithTimeout(batch[0].ctx, 30*time.Second)
		_, err := e.q.Send(ctx, e.queue, msgs...)
		cancel()
		if err == nil {
			e.published(len(msgs))
			return
		}
		if se, ok := err.(*queue.SendError); ok && se.Err == nil {
			// Only some entries were refused: retry exactly those.
			var again []queue.Outgoing
			for _, f := range se.Failed {
				again = append(again, msgs[f.Index])
			}
			e.published(len(msgs) - len(again))
			msgs = again
		}
		e.log.Warn("runner: sending events, will retry", "events", len(msgs), "error", err)
		time.Sleep(delay)
		delay = min(delay*2, 5*time.Second)
	}
}
