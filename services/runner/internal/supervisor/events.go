package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
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
// shuts down. Events are buffered in memory: a runner that crashes loses
// those not yet sent (the store, not the events, is the record of an
// instance; see docs/runner.md).
type events struct {
	q      queue.Queue
	queue  string
	source string
	log    *slog.Logger
	// published counts envelopes sent, for metrics.
	published func(n int)

	mu      sync.Mutex
	pending []pendingEvent
	// room is signalled as the backlog shrinks, for updates waiting on it.
	room   *sync.Cond
	closed bool
	wake   chan struct{}
	done   chan struct{}
}

// maxBacklog is how many events may wait before an agent's updates wait
// for room: a stalled queue slows the agent rather than growing without
// bound. Status changes never wait (they are few, and are published with
// the status lock held).
const maxBacklog = 8192

func newEvents(q queue.Queue, queueName, source string, logger *slog.Logger, published func(int)) *events {
	e := &events{q: q, queue: queueName, source: source, log: logger, wake: make(chan struct{}, 1), done: make(chan struct{}), published: published}
	e.room = sync.NewCond(&e.mu)
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
	p := pendingEvent{ctx: context.WithoutCancel(ctx), env: env}
	e.mu.Lock()
	for typ != EventStatusChanged && len(e.pending) >= maxBacklog && !e.closed {
		e.room.Wait()
	}
	if e.closed {
		// After shutdown (a request still draining): sent on its own.
		e.mu.Unlock()
		e.send([]pendingEvent{p}, time.Now().Add(10*time.Second))
		return
	}
	e.pending = append(e.pending, p)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Close sends what is queued, giving up after the deadline of ctx.
func (e *events) Close(ctx context.Context) {
	e.mu.Lock()
	e.closed = true
	e.room.Broadcast()
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		e.mu.Lock()
		n := len(e.pending)
		e.mu.Unlock()
		e.log.Warn("runner: events not sent before shutdown", "queued", n)
	}
}

func (e *events) run() {
	defer close(e.done)
	for {
		e.mu.Lock()
		n := min(len(e.pending), queue.MaxBatch)
		batch := e.pending[:n:n]
		e.pending = e.pending[n:]
		closed := e.closed
		if n > 0 {
			e.room.Broadcast()
		}
		e.mu.Unlock()
		if n > 0 {
			deadline := time.Time{}
			if closed {
				deadline = time.Now().Add(10 * time.Second)
			}
			e.send(batch, deadline)
			continue
		}
		if closed {
			return
		}
		<-e.wake
	}
}

// send sends batch, retrying failures until they succeed or, if deadline
// is set, until it passes.
func (e *events) send(batch []pendingEvent, deadline time.Time) {
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
		if !deadline.IsZero() && time.Now().Add(delay).After(deadline) {
			e.log.Warn("runner: events not sent before shutdown", "events", len(msgs), "error", err)
			return
		}
		e.log.Warn("runner: sending events, will retry", "events", len(msgs), "error", err)
		time.Sleep(delay)
		delay = min(delay*2, 5*time.Second)
	}
}
