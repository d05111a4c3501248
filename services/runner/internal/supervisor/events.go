package supervisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// Event types the runner sends.
const (
	EventSessionUpdate = "runner.session.update"
	EventStatusChanged = "runner.task.status_changed"
)

type pendingEvent struct {
	ctx context.Context
	env *eventsv1.Envelope
	seq uint64
}

// events sends envelopes to the events queue in order, in batches, from one
// goroutine, so that an agent's stream is never held up by a queue round
// trip per update. A failed send is retried until it succeeds or the runner
// shuts down. Events wait in memory; a status change's event is also
// written, with the change, in the instance's outbox (see Supervisor's
// drainOutbox), so that one a crash kept from being sent is sent by the
// next delivery of the instance's launch. Publish numbers events, and
// waitSent waits for every event up to a number to be handed to the queue.
type events struct {
	q      queue.Queue
	queue  string
	source string
	log    *slog.Logger
	// published counts envelopes sent, for metrics.
	published func(n int)
	// hold, when set, is called with each envelope before it is sent (a
	// test's crash point).
	hold func(*eventsv1.Envelope)

	mu      sync.Mutex
	pending []pendingEvent
	// room is signalled as the backlog shrinks, for updates waiting on it.
	room   *sync.Cond
	closed bool
	wake   chan struct{}
	done   chan struct{}
	// seq numbers the events published; handled is the highest number
	// whose send has ended (sent, or given up on at shutdown), and
	// progress is closed (and replaced) whenever handled advances.
	seq      uint64
	handled  uint64
	progress chan struct{}
	// tracked are the outbox events published and not yet handled, by id,
	// with their numbers; sent remembers the ids of outbox events sent, so
	// that later writes drop them from the outbox (sentOrder bounds it).
	tracked   map[string]uint64
	sent      map[string]struct{}
	sentOrder []string
}

// maxBacklog is how many events may wait before an agent's updates wait
// for room: a stalled queue slows the agent rather than growing without
// bound. Status changes never wait (they are few, and are published with
// the status lock held).
const maxBacklog = 8192

// maxSentIDs bounds how many sent outbox ids are remembered; one forgotten
// before its outbox entry was dropped is sent again, under its id.
const maxSentIDs = 1 << 14

func newEvents(q queue.Queue, queueName, source string, logger *slog.Logger, published func(int)) *events {
	e := &events{q: q, queue: queueName, source: source, log: logger, wake: make(chan struct{}, 1), done: make(chan struct{}), published: published,
		progress: make(chan struct{}), tracked: map[string]uint64{}, sent: map[string]struct{}{}}
	e.room = sync.NewCond(&e.mu)
	go e.run()
	return e
}

func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// prepare makes an event about instanceID of taskID, in the trace of ctx,
// as it is kept in an outbox.
func (e *events) prepare(ctx context.Context, typ, taskID, instanceID string, payload map[string]any) records.OutboxEvent {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return records.OutboxEvent{ID: newEventID(), Type: typ, Time: time.Now().UTC(), TaskID: taskID, InstanceID: instanceID, Payload: payload,
		Traceparent: carrier["traceparent"], Tracestate: carrier["tracestate"]}
}

// envelope rebuilds ev's envelope: the same each time, id included.
func (e *events) envelope(ev records.OutboxEvent) (*eventsv1.Envelope, error) {
	s, err := structpb.NewStruct(ev.Payload)
	if err != nil {
		return nil, err
	}
	packed, _ := anypb.New(s)
	env := &eventsv1.Envelope{
		Id: ev.ID, Type: ev.Type, Source: e.source, Time: timestamppb.New(ev.Time),
		SubjectIds: map[string]string{"task_id": ev.TaskID, "instance_id": ev.InstanceID},
		Payload:    packed,
	}
	if ev.Traceparent != "" {
		env.TraceContext = &eventsv1.TraceContext{Traceparent: ev.Traceparent, Tracestate: ev.Tracestate}
	}
	return env, nil
}

// Publish queues an event about instanceID of taskID.
func (e *events) Publish(ctx context.Context, typ, taskID, instanceID string, payload map[string]any) {
	e.publish(ctx, e.prepare(ctx, typ, taskID, instanceID, payload), false)
}

// PublishOutbox queues an event kept in an outbox and returns its number,
// for waitSent; sent tells whether it was.
func (e *events) PublishOutbox(ctx context.Context, ev records.OutboxEvent) uint64 {
	return e.publish(ctx, ev, true)
}

func (e *events) publish(ctx context.Context, ev records.OutboxEvent, outbox bool) uint64 {
	env, err := e.envelope(ev)
	if err != nil {
		e.log.WarnContext(ctx, "runner: an event payload is not representable", "type", ev.Type, "error", err)
		return 0
	}
	if env.TraceContext != nil {
		// The event's own trace, which the queue message carries too.
		if sc := traceFromEnvelope(env); sc.IsValid() {
			ctx = trace.ContextWithSpanContext(ctx, sc)
		}
	}
	p := pendingEvent{ctx: context.WithoutCancel(ctx), env: env}
	e.mu.Lock()
	for ev.Type != EventStatusChanged && len(e.pending) >= maxBacklog && !e.closed {
		e.room.Wait()
	}
	e.seq++
	p.seq = e.seq
	if outbox {
		e.tracked[ev.ID] = p.seq
	}
	if e.closed {
		// After shutdown (a request still draining): sent on its own.
		e.mu.Unlock()
		e.send([]pendingEvent{p}, time.Now().Add(10*time.Second))
		return p.seq
	}
	e.pending = append(e.pending, p)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return p.seq
}

// traceFromEnvelope is the span context an envelope's trace context names.
func traceFromEnvelope(env *eventsv1.Envelope) trace.SpanContext {
	carrier := propagation.MapCarrier{"traceparent": env.GetTraceContext().GetTraceparent(), "tracestate": env.GetTraceContext().GetTracestate()}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
}

// Sent reports whether the outbox event id was sent by this runner.
func (e *events) Sent(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.sent[id]
	return ok
}

// Tracked returns the number of outbox event id if it is published and
// not yet sent.
func (e *events) Tracked(id string) (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	seq, ok := e.tracked[id]
	return seq, ok
}

// Unsent is outbox without the events known to be sent.
func (e *events) Unsent(outbox []records.OutboxEvent) []records.OutboxEvent {
	if len(outbox) == 0 {
		return outbox
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []records.OutboxEvent
	for _, ev := range outbox {
		if _, ok := e.sent[ev.ID]; !ok {
			out = append(out, ev)
		}
	}
	return out
}

// Last is the number of the event published last.
func (e *events) Last() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

// waitSent waits until every event up to number seq has been handed to the
// queue (or given up on at shutdown), or until stop is closed, and reports
// which.
func (e *events) waitSent(seq uint64, stop <-chan struct{}) bool {
	for {
		e.mu.Lock()
		handled, progress := e.handled, e.progress
		e.mu.Unlock()
		if handled >= seq {
			return true
		}
		select {
		case <-progress:
		case <-stop:
			return false
		}
	}
}

// finished records the end of a batch's send: which outbox events were
// sent, and how far sending has come.
func (e *events) finished(batch []pendingEvent, sent []bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, p := range batch {
		id := p.env.GetId()
		if _, ok := e.tracked[id]; ok {
			delete(e.tracked, id)
			if sent[i] {
				e.sent[id] = struct{}{}
				e.sentOrder = append(e.sentOrder, id)
			}
		}
		e.handled = max(e.handled, p.seq)
	}
	if over := len(e.sentOrder) - maxSentIDs; over > 0 {
		for _, id := range e.sentOrder[:over] {
			delete(e.sent, id)
		}
		e.sentOrder = append([]string(nil), e.sentOrder[over:]...)
	}
	close(e.progress)
	e.progress = make(chan struct{})
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
	sent := make([]bool, len(batch))
	defer func() { e.finished(batch, sent) }()
	if e.hold != nil {
		for _, p := range batch {
			e.hold(p.env)
		}
	}
	msgs := make([]queue.Outgoing, 0, len(batch))
	// index maps msgs back to batch.
	index := make([]int, 0, len(batch))
	for i, p := range batch {
		body, err := queue.EncodeEnvelope(p.env)
		if err != nil {
			e.log.Warn("runner: encoding an event", "error", err)
			continue
		}
		msgs = append(msgs, queue.Outgoing{Body: body})
		index = append(index, i)
	}
	delay := 100 * time.Millisecond
	for len(msgs) > 0 {
		ctx, cancel := context.WithTimeout(batch[index[0]].ctx, 30*time.Second)
		_, err := e.q.Send(ctx, e.queue, msgs...)
		cancel()
		if err == nil {
			for _, i := range index {
				sent[i] = true
			}
			e.published(len(msgs))
			return
		}
		if se, ok := err.(*queue.SendError); ok && se.Err == nil {
			// Only some entries were refused: retry exactly those.
			failed := make(map[int]bool, len(se.Failed))
			for _, f := range se.Failed {
				failed[f.Index] = true
			}
			var again []queue.Outgoing
			var againIndex []int
			for j, m := range msgs {
				if failed[j] {
					again = append(again, m)
					againIndex = append(againIndex, index[j])
				} else {
					sent[index[j]] = true
				}
			}
			e.published(len(msgs) - len(again))
			msgs, index = again, againIndex
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
