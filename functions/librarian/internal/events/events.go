// Package events turns the Librarian's state changes into
// conclave.events.v1 envelopes on its queue, for the bus to publish as
// system:librarian.* (the protocol's "future" WebSocket events). An event is
// built and stored with the state change it reports, in the same item, and
// published after; Publish is retried until it succeeds, so delivery is at
// least once and consumers deduplicate on the envelope id.
package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
)

// Queue is the bus's events queue (services/bus's broker.EventsQueue; a
// service does not import another, so it is declared again here, the same
// in every attribute because both Ensure it): the bus publishes each
// envelope on it as system:{type}, so the Librarian's land on
// system:librarian.*.
var Queue = queue.Definition{Name: "bus-events", VisibilityTimeout: 2 * time.Minute, MaxReceiveCount: 5}

// The event types, as the envelope's type.
const (
	Submitted            = "librarian.request.submitted"
	Approved             = "librarian.request.approved"
	Rejected             = "librarian.request.rejected"
	Escalated            = "librarian.request.escalated"
	Completed            = "librarian.request.completed"
	SpecificationChanged = "librarian.specification.changed"
)

// Source names the producer in envelopes.
const Source = "librarian"

// New builds an envelope of type typ about payload, carrying ctx's trace
// context.
func New(ctx context.Context, typ string, subject map[string]string, payload proto.Message, now time.Time) (*eventsv1.Envelope, error) {
	body, err := anypb.New(payload)
	if err != nil {
		return nil, fmt.Errorf("events: %s payload: %w", typ, err)
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	env := &eventsv1.Envelope{Id: hex.EncodeToString(id), Type: typ, Source: Source, Time: timestamppb.New(now), SubjectIds: subject, Payload: body}
	if tp := carrier.Get("traceparent"); tp != "" {
		env.TraceContext = &eventsv1.TraceContext{Traceparent: tp, Tracestate: carrier.Get("tracestate")}
	}
	return env, nil
}

// Publisher sends envelopes to the queue.
type Publisher struct {
	q queue.Queue
}

// NewPublisher sends on q; Queue must exist.
func NewPublisher(q queue.Queue) *Publisher { return &Publisher{q: q} }

// Publish sends envelopes, in order, in batches. Each message carries its
// envelope's own trace context (the trace the request was submitted in),
// not the caller's, so that the bus publishes it in that trace.
func (p *Publisher) Publish(ctx context.Context, envs ...*eventsv1.Envelope) error {
	for len(envs) > 0 {
		// A run of envelopes of one trace, sent in one batch.
		tc := envs[0].GetTraceContext()
		n := 1
		for n < len(envs) && n < queue.MaxBatch && envs[n].GetTraceContext().GetTraceparent() == tc.GetTraceparent() {
			n++
		}
		msgs := make([]queue.Outgoing, 0, n)
		for _, env := range envs[:n] {
			body, err := queue.EncodeEnvelope(env)
			if err != nil {
				return fmt.Errorf("events: encode %s: %w", env.GetType(), err)
			}
			msgs = append(msgs, queue.Outgoing{Body: body, Attributes: map[string]string{"type": env.GetType(), "event_id": env.GetId()}})
		}
		sendCtx := ctx
		if tc.GetTraceparent() != "" {
			sendCtx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tc.GetTraceparent(), "tracestate": tc.GetTracestate()})
		}
		if _, err := p.q.Send(sendCtx, Queue.Name, msgs...); err != nil {
			return fmt.Errorf("events: send: %w", err)
		}
		envs = envs[n:]
	}
	return nil
}
