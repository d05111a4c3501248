package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// RetryQueue is the queue holding agent deliveries waiting for another
// attempt. Its messages are delayed by the retry delay, so the queue itself
// is the timer, and a bus restart loses none of them.
var RetryQueue = queue.Definition{
	Name: "bus-retries",
	// Longer than any delivery, so a message is not handed to a second
	// consumer while the first still delivers it.
	VisibilityTimeout: 5 * time.Minute,
	// A message whose handling keeps failing (the store is down) still
	// ends somewhere an operator looks.
	MaxReceiveCount: 20,
}

// DeadLetterTable holds messages that ran out of attempts, or that the
// default handler could not place, with why.
var DeadLetterTable = store.Table{Name: "bus_dead_letters"}

// deadLetterPK is the one partition of the table; sort keys begin with the
// time, so a query lists dead letters oldest first.
const deadLetterPK = "dead-letter"

// RetryPolicy bounds retries.
type RetryPolicy struct {
	// MaxAttempts counts every delivery, the first included.
	MaxAttempts int
	// BaseDelay is the first retry's delay when the agent asks for none;
	// it doubles with each attempt.
	BaseDelay time.Duration
	// MaxDelay caps every delay, the agent's retry_seconds included; at
	// most 15 minutes, the longest queue delay.
	MaxDelay time.Duration
}

// Retries schedules agent redeliveries through a queue and keeps dead
// letters in a table.
type Retries struct {
	q      queue.Queue
	st     store.Store
	policy RetryPolicy
	log    *slog.Logger
	tp     trace.TracerProvider
	tracer trace.Tracer
	broker *Broker
}

// NewRetries returns the retry machinery; RetryQueue and DeadLetterTable
// must exist. tp makes the spans of retried deliveries, which continue the
// publisher's trace.
func NewRetries(q queue.Queue, st store.Store, policy RetryPolicy, tp trace.TracerProvider, logger *slog.Logger) *Retries {
	if policy.MaxAttempts <= 0 {
		policy.MaxAttempts = 3
	}
	if policy.BaseDelay <= 0 {
		policy.BaseDelay = time.Second
	}
	if policy.MaxDelay <= 0 || policy.MaxDelay > queue.MaxDelay {
		policy.MaxDelay = queue.MaxDelay
	}
	tracer := noop.NewTracerProvider().Tracer("")
	if tp != nil {
		tracer = tp.Tracer("github.com/conclave-ai/conclave/services/bus")
	}
	return &Retries{q: q, st: st, policy: policy, tp: tp, tracer: tracer, log: logger}
}

// retryJob is a retry queue message's body.
type retryJob struct {
	MessageID string          `json:"message_id"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	ClientID  string          `json:"client_id"`
	Publisher string          `json:"publisher,omitempty"`
	Origin
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error"`
	PublishedAt time.Time `json:"published_at"`
}

// DeadLetter is a message the bus gave up on.
type DeadLetter struct {
	ID        string          `json:"id"`
	MessageID string          `json:"message_id"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	ClientID  string          `json:"client_id,omitempty"`
	Publisher string          `json:"publisher,omitempty"`
	Origin
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error"`
	PublishedAt time.Time `json:"published_at"`
	DeadAt      time.Time `json:"dead_at"`
	// Traceparent and Tracestate are the message's trace context (W3C), so
	// that a redrive delivers it in the trace it was published in.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// delay is the wait before the next attempt, after attempts so far.
func (r *Retries) delay(attempts int, requested time.Duration) time.Duration {
	d := requested
	if d <= 0 {
		d = r.policy.BaseDelay << min(attempts-1, 20)
	}
	return min(d, r.policy.MaxDelay)
}

// afterAttempt schedules the next attempt of a failed or deferred agent
// delivery, or dead-letters it, and returns the ack message saying which.
func (r *Retries) afterAttempt(ctx context.Context, msg *message, clientID string, attempt int, out outcome) string {
	job := retryJob{MessageID: msg.id, Topic: msg.topic, Payload: msg.payload, ClientID: clientID,
		Publisher: msg.publisher, Origin: msg.origin, Attempts: attempt, LastError: out.err, PublishedAt: time.Now().UTC()}
	next, err := r.schedule(ctx, job, out.retryAfter)
	if err != nil {
		r.log.ErrorContext(ctx, "bus: could not schedule a retry or dead letter", "message_id", msg.id, "error", err)
		return fmt.Sprintf("%s; the retry could not be scheduled: %v", out.err, err)
	}
	return fmt.Sprintf("%s; %s", out.err, next)
}

// schedule enqueues the next attempt, or dead-letters job when its attempts
// are used up, and says which it did.
func (r *Retries) schedule(ctx context.Context, job retryJob, requested time.Duration) (string, error) {
	if job.Attempts >= r.policy.MaxAttempts {
		if err := r.deadLetter(ctx, job, "attempts"); err != nil {
			return "", err
		}
		return fmt.Sprintf("dead-lettered after %d attempts", job.Attempts), nil
	}
	d := r.delay(job.Attempts, requested)
	body, err := json.Marshal(job)
	if err != nil {
		return "", err
	}
	if _, err := r.q.Send(ctx, RetryQueue.Name, queue.Outgoing{Body: body, Delay: d}); err != nil {
		return "", fmt.Errorf("enqueueing the retry: %w", err)
	}
	r.broker.opts.Metrics.retried(ctx)
	return fmt.Sprintf("attempt %d of %d scheduled in %s", job.Attempts+1, r.policy.MaxAttempts, d), nil
}

func (r *Retries) deadLetter(ctx context.Context, job retryJob, reason string) error {
	now := time.Now().UTC()
	dl := DeadLetter{ID: fmt.Sprintf("%s-%s", now.Format("20060102T150405.000000000Z"), job.MessageID),
		MessageID: job.MessageID, Topic: job.Topic, Payload: job.Payload, ClientID: job.ClientID,
		Publisher: job.Publisher, Origin: job.Origin, Attempts: job.Attempts, LastError: job.LastError,
		PublishedAt: job.PublishedAt, DeadAt: now}
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, tc)
	dl.Traceparent, dl.Tracestate = tc["traceparent"], tc["tracestate"]
	data, err := json.Marshal(dl)
	if err != nil {
		return err
	}
	if _, err := r.st.Put(ctx, DeadLetterTable.Name, store.Item{Key: store.Key{PK: deadLetterPK, SK: dl.ID}, Data: data}); err != nil {
		return fmt.Errorf("storing the dead letter: %w", err)
	}
	r.broker.opts.Metrics.deadLettered(ctx, reason)
	r.log.WarnContext(ctx, "bus: message dead-lettered", "dead_letter_id", dl.ID, "message_id", job.MessageID,
		"client_id", job.ClientID, "attempts", job.Attempts, "last_error", job.LastError)
	return nil
}

// Run consumes the retry queue until ctx ends.
func (r *Retries) Run(ctx context.Context) error {
	return queue.Consume(ctx, r.q, RetryQueue.Name, r.handle, queue.ConsumerOptions{
		Workers: 4, Visibility: RetryQueue.VisibilityTimeout, Logger: r.log, TracerProvider: r.tp})
}

// handle makes one more attempt. It returns an error only when neither the
// next attempt nor the dead letter could be recorded, so the queue keeps
// the message.
func (r *Retries) handle(ctx context.Context, m queue.Message) error {
	var job retryJob
	if err := json.Unmarshal(m.Body, &job); err != nil {
		// Not ours to retry; keep it for inspection rather than loop on it.
		return r.deadLetter(ctx, retryJob{MessageID: m.ID, Payload: json.RawMessage(`{}`),
			LastError: fmt.Sprintf("undecodable retry message: %v", err)}, "undecodable")
	}
	job.Attempts++
	msg := &message{id: job.MessageID, topic: job.Topic, payload: job.Payload, publisher: job.Publisher, origin: job.Origin, accepted: time.Now()}
	if job.ClientID == "" {
		// A redriven message the default handler could not place: it goes
		// to whichever agent now subscribes, or to the default handler again.
		if s := r.broker.anyAgentFor(job.Topic); s != nil {
			job.ClientID = s.ClientID()
		} else if h := r.broker.opts.DefaultHandler; h != nil {
			h.take(ctx, msg)
			return nil
		}
	}
	s := r.broker.agentFor(job.ClientID, job.Topic)
	if s == nil && r.broker.opts.Forwarder != nil {
		// The agent may be connected to another replica, which then
		// delivers and schedules what follows itself.
		res := r.broker.opts.Forwarder.Forward(ctx, Forwarded{MessageID: job.MessageID, Topic: job.Topic,
			Payload: job.Payload, Publisher: job.Publisher, Origin: job.Origin, ClientID: job.ClientID, Attempt: job.Attempts})
		if res.Routed {
			return nil
		}
	}
	var out outcome
	if s == nil {
		out = outcome{failed: true, err: fmt.Sprintf("agent %q is not connected and subscribed to %q", job.ClientID, job.Topic)}
		r.broker.opts.Metrics.delivered(ctx, MethodProcessMessage, "failed")
	} else {
		out = r.broker.call(ctx, s, msg, job.Attempts)
	}
	if !out.failed && !out.retry {
		return nil // processed, or declined without asking for a retry
	}
	job.LastError = out.err
	if _, err := r.schedule(ctx, job, out.retryAfter); err != nil {
		return err
	}
	return nil
}

// ErrDeadLetterNotFound is returned for an unknown dead-letter id.
var ErrDeadLetterNotFound = errors.New("dead letter not found")

// ListDeadLetters returns up to limit dead letters, oldest first, from
// cursor; the returned cursor continues the listing.
func (r *Retries) ListDeadLetters(ctx context.Context, limit int, cursor string) ([]DeadLetter, string, error) {
	page, err := r.st.Query(ctx, DeadLetterTable.Name, store.Query{PK: deadLetterPK, Limit: limit, Cursor: cursor})
	if err != nil {
		return nil, "", err
	}
	out := make([]DeadLetter, 0, len(page.Items))
	for _, it := range page.Items {
		var dl DeadLetter
		if err := json.Unmarshal(it.Data, &dl); err != nil {
			return nil, "", fmt.Errorf("dead letter %s: %w", it.SK, err)
		}
		out = append(out, dl)
	}
	return out, page.Cursor, nil
}

// DeadLetter returns one dead letter.
func (r *Retries) DeadLetter(ctx context.Context, id string) (DeadLetter, error) {
	it, err := r.st.Get(ctx, DeadLetterTable.Name, store.Key{PK: deadLetterPK, SK: id})
	if errors.Is(err, store.ErrNotFound) {
		return DeadLetter{}, fmt.Errorf("%w: %s", ErrDeadLetterNotFound, id)
	}
	if err != nil {
		return DeadLetter{}, err
	}
	var dl DeadLetter
	if err := json.Unmarshal(it.Data, &dl); err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %s: %w", id, err)
	}
	return dl, nil
}

// Redrive puts a dead letter back on the retry queue with a fresh set of
// attempts, then removes it from the table. A crash between the two leaves
// both, never neither. The message goes back in the trace it was
// published in (a "bus redrive" span there, linked to the trace of the
// redrive's request), so its redelivery is seen in Jaeger after its
// attempts and its dead-lettering.
func (r *Retries) Redrive(ctx context.Context, id string) error {
	dl, err := r.DeadLetter(ctx, id)
	if err != nil {
		return err
	}
	if dl.Traceparent != "" {
		orig := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": dl.Traceparent, "tracestate": dl.Tracestate})
		if trace.SpanContextFromContext(orig).IsValid() {
			var span trace.Span
			ctx, span = r.tracer.Start(orig, "bus redrive", trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithLinks(trace.LinkFromContext(ctx)),
				trace.WithAttributes(attribute.String("messaging.system", "conclave-bus"), attribute.String("messaging.destination.name", dl.Topic),
					attribute.String("messaging.message.id", dl.MessageID)))
			defer span.End()
		}
	}
	body, err := json.Marshal(retryJob{MessageID: dl.MessageID, Topic: dl.Topic, Payload: dl.Payload,
		ClientID: dl.ClientID, Publisher: dl.Publisher, Origin: dl.Origin, LastError: dl.LastError, PublishedAt: dl.PublishedAt})
	if err != nil {
		return err
	}
	if _, err := r.q.Send(ctx, RetryQueue.Name, queue.Outgoing{Body: body}); err != nil {
		return fmt.Errorf("redriving %s: %w", id, err)
	}
	return r.st.Delete(ctx, DeadLetterTable.Name, store.Key{PK: deadLetterPK, SK: id})
}
