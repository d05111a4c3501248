package broker

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	"github.com/conclave-ai/conclave/services/bus/internal/topic"
)

// EventsQueue is where other services (the runner's task events, the
// Librarian's governance events) send event envelopes for the bus to
// publish. Its body is a conclave.events.v1.Envelope as every producer
// encodes it (queue.EncodeEnvelope: protojson).
var EventsQueue = queue.Definition{
	Name:              "bus-events",
	VisibilityTimeout: 2 * time.Minute,
	// An envelope that cannot be published after this many receives goes to
	// bus-events-dlq for an operator.
	MaxReceiveCount: 5,
}

// EventPublisher "events" is the publisher named in acks and logs for
// messages that came from the events queue.
const EventPublisher = "events"

// Events publishes the envelopes of EventsQueue on the bus: an event about
// a task on task:{task_id}, any other on system:{type}.
type Events struct {
	q      queue.Queue
	broker *Broker
	tp     trace.TracerProvider
	log    *slog.Logger
}

// NewEvents returns the events consumer of b.
func NewEvents(q queue.Queue, b *Broker, tp trace.TracerProvider, logger *slog.Logger) *Events {
	return &Events{q: q, broker: b, tp: tp, log: logger}
}

// Run consumes EventsQueue until ctx ends.
func (e *Events) Run(ctx context.Context) error {
	return queue.Consume(ctx, e.q, EventsQueue.Name, e.handle, queue.ConsumerOptions{
		Workers: 2, Visibility: EventsQueue.VisibilityTimeout, Logger: e.log, TracerProvider: e.tp})
}

// eventPayload is what subscribers receive.
type eventPayload struct {
	Type       string            `json:"type"`
	EventID    string            `json:"event_id"`
	Source     string            `json:"source,omitempty"`
	Time       string            `json:"time,omitempty"`
	SubjectIDs map[string]string `json:"subject_ids,omitempty"`
	// Data is the event's payload as its producer encoded it: protojson
	// with the proto field names, and its "@type" (queue.EncodeEnvelope),
	// whether or not its type is linked into the bus. From a producer of
	// the base64 binary encoding, a payload of a type the bus does not link
	// is {"@type": url, "value": base64 bytes}.
	Data json.RawMessage `json:"data,omitempty"`
}

// EventTopic is the bus topic of an envelope.
func EventTopic(env *eventsv1.Envelope) string {
	if id := env.GetSubjectIds()["task_id"]; id != "" {
		return "task:" + id
	}
	return "system:" + env.GetType()
}

func (e *Events) handle(ctx context.Context, m queue.Message) error {
	env, data, err := queue.DecodeEnvelopeJSON(m.Body)
	if err != nil {
		// Retrying cannot fix it: log it and let it go.
		e.log.WarnContext(ctx, "bus: dropping an undecodable event", "message_id", m.ID, "error", err)
		return nil
	}
	t := EventTopic(env)
	if err := topic.Validate(t); err != nil {
		e.log.WarnContext(ctx, "bus: dropping an event whose topic is invalid", "event_id", env.GetId(), "error", err)
		return nil
	}
	if !trace.SpanContextFromContext(ctx).IsValid() && env.GetTraceContext().GetTraceparent() != "" {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{
			"traceparent": env.GetTraceContext().GetTraceparent(), "tracestate": env.GetTraceContext().GetTracestate()})
	}
	p := eventPayload{Type: env.GetType(), EventID: env.GetId(), Source: env.GetSource(), SubjectIDs: env.GetSubjectIds()}
	if env.GetTime() != nil {
		p.Time = env.GetTime().AsTime().UTC().Format(time.RFC3339Nano)
	}
	p.Data = data
	payload, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, err := e.broker.PublishEvent(ctx, t, payload); err != nil {
		e.log.WarnContext(ctx, "bus: an event was refused", "event_id", env.GetId(), "topic", t, "error", err)
	}
	return nil
}
