// Package metrics is the gateway's domain metrics, named and labelled by the
// convention in docs/metrics.md: every label value comes from a fixed set,
// never from an agent, request or client.
package metrics

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Registration outcomes.
const (
	Welcome         = "welcome"
	Duplicate       = "duplicate"
	Unauthenticated = "unauthenticated"
	Denied          = "denied"
	Invalid         = "invalid"
	Unavailable     = "unavailable"
)

// Request outcomes.
const (
	Done             = "done"
	AgentError       = "error"
	Cancelled        = "cancelled"
	AgentGone        = "agent_gone"
	CallerLeft       = "caller_left"
	QueueFull        = "queue_full"
	NotFound         = "not_found"
	RateLimited      = "rate_limited"
	IdempotentRepeat = "idempotent_repeat"
	Replayed         = "replayed" // a repeated idempotency key answered from the history
	Refused          = "refused"  // any other refusal before the request reached an agent
)

// Eviction reasons: why the gateway ended an agent's stream.
const (
	Silent         = "silent"
	LeaseLost      = "lease_lost"
	HeartbeatFlood = "heartbeat_flood"
)

// Metrics are the gateway's instruments. The zero of none of them is
// usable; make them with New, or Discard in tests that do not look.
type Metrics struct {
	replica           metric.MeasurementOption
	agents            metric.Int64UpDownCounter
	registrations     metric.Int64Counter
	requests          metric.Int64Counter
	queued            metric.Int64UpDownCounter
	firstEvent        metric.Float64Histogram
	duration          metric.Float64Histogram
	events            metric.Int64Counter
	dropped           metric.Int64Counter
	forwarded         metric.Int64Counter
	leaseWrites       metric.Int64Counter
	leaseWriteTime    metric.Float64Histogram
	registrationsLost metric.Int64Counter
	evictions         metric.Int64Counter
	historyWrites     metric.Int64Counter
	historyWriteTime  metric.Float64Histogram
	a2aCalls          metric.Int64Counter
	a2aTasks          metric.Int64Counter
}

// New makes the gateway's instruments from m; replica (the server ID) labels
// the connected-agents gauge, one value per process.
func New(m metric.Meter, replica string) *Metrics {
	name := func(thing string) string { return telemetry.MetricName("gateway", thing) }
	x := &Metrics{replica: metric.WithAttributes(attribute.String("replica", replica))}
	// Instrument creation fails only on an invalid name, which the
	// convention's MetricName has already ruled out.
	x.agents, _ = m.Int64UpDownCounter(name("agents_connected"), metric.WithUnit("{agent}"),
		metric.WithDescription("Agents whose AgentStream this replica holds."))
	x.registrations, _ = m.Int64Counter(name("registrations"), metric.WithUnit("{registration}"),
		metric.WithDescription("AgentStream registrations, by outcome."))
	x.requests, _ = m.Int64Counter(name("requests"), metric.WithUnit("{request}"),
		metric.WithDescription("Client SendMessage requests handled on this replica, by outcome."))
	x.queued, _ = m.Int64UpDownCounter(name("requests_queued"), metric.WithUnit("{request}"),
		metric.WithDescription("Requests waiting for a busy agent."))
	buckets := metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
	x.firstEvent, _ = m.Float64Histogram(name("request_first_event_duration"), metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a request's arrival to the agent's first event."))
	x.duration, _ = m.Float64Histogram(name("request_duration"), metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a request's arrival to its end."))
	x.events, _ = m.Int64Counter(name("events_relayed"), metric.WithUnit("{event}"),
		metric.WithDescription("Agent events relayed to clients."))
	x.dropped, _ = m.Int64Counter(name("responses_dropped"), metric.WithUnit("{response}"),
		metric.WithDescription("Agent responses for requests not in flight, dropped."))
	x.forwarded, _ = m.Int64Counter(name("forwarded_requests"), metric.WithUnit("{request}"),
		metric.WithDescription("Requests forwarded to the replica holding the agent, by outcome (ok, error)."))
	x.leaseWrites, _ = m.Int64Counter(name("lease_writes"), metric.WithUnit("{write}"),
		metric.WithDescription("Writes of this replica's lease, by outcome (renewed, failed, established)."))
	x.leaseWriteTime, _ = m.Float64Histogram(name("lease_write_duration"), metric.WithUnit("s"), buckets,
		metric.WithDescription("How long a lease write took."))
	x.registrationsLost, _ = m.Int64Counter(name("registrations_lost"), metric.WithUnit("{registration}"),
		metric.WithDescription("Agent registrations another connection took while this replica's lease had expired."))
	x.evictions, _ = m.Int64Counter(name("evictions"), metric.WithUnit("{agent}"),
		metric.WithDescription("Agent streams the gateway ended, by reason (silent, lease_lost, heartbeat_flood)."))
	x.historyWrites, _ = m.Int64Counter(name("history_writes"), metric.WithUnit("{item}"),
		metric.WithDescription("Items written to the history store, by outcome (ok, failed)."))
	x.historyWriteTime, _ = m.Float64Histogram(name("history_write_duration"), metric.WithUnit("s"), buckets,
		metric.WithDescription("How long one write of history items (a batch of a request's entries) took."))
	x.a2aCalls, _ = m.Int64Counter(name("a2a_calls"), metric.WithUnit("{call}"),
		metric.WithDescription("A2A calls, by method and outcome (served, refused)."))
	x.a2aTasks, _ = m.Int64Counter(name("a2a_tasks_ended"), metric.WithUnit("{task}"),
		metric.WithDescription("A2A tasks whose end this replica recorded, by state (completed, failed, canceled)."))
	return x
}

// Discard is Metrics that record nothing.
func Discard() *Metrics { return New(noop.NewMeterProvider().Meter(""), "") }

var ctx = context.Background()

// outcomes holds each outcome's attribute option, made once: building an
// attribute set sorts and hashes it, and the requests and history writes
// counted here are per message.
var outcomes sync.Map // string → metric.MeasurementOption

// outcome is the option labelling a count with o, one of this package's
// constants, so the map stays as small as that set.
func outcome(o string) metric.AddOption {
	if opt, ok := outcomes.Load(o); ok {
		return opt.(metric.MeasurementOption)
	}
	opt := metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
	outcomes.Store(o, opt)
	return opt
}

// Registered counts a registration's outcome.
func (x *Metrics) Registered(o string) { x.registrations.Add(ctx, 1, outcome(o)) }

// Connected moves the connected-agents gauge.
func (x *Metrics) Connected(delta int64) { x.agents.Add(ctx, delta, x.replica) }

// Request counts a request's outcome.
func (x *Metrics) Request(o string) { x.requests.Add(ctx, 1, outcome(o)) }

// Queued moves the queued-requests gauge.
func (x *Metrics) Queued(delta int64) { x.queued.Add(ctx, delta) }

// FirstEvent records the time to a request's first event.
func (x *Metrics) FirstEvent(d time.Duration) { x.firstEvent.Record(ctx, d.Seconds()) }

// Finished records a request's whole duration.
func (x *Metrics) Finished(d time.Duration) { x.duration.Record(ctx, d.Seconds()) }

// Relayed counts an event relayed to a client.
func (x *Metrics) Relayed() { x.events.Add(ctx, 1) }

// Dropped counts a dropped response.
func (x *Metrics) Dropped() { x.dropped.Add(ctx, 1) }

// Forwarded counts a forwarded request's outcome.
func (x *Metrics) Forwarded(ok bool) {
	o := "ok"
	if !ok {
		o = "error"
	}
	x.forwarded.Add(ctx, 1, outcome(o))
}

// Lease counts a lease write (renewed, failed, established) and its time,
// or a registration lost ("lost").
func (x *Metrics) Lease(event string, took time.Duration) {
	if event == "lost" {
		x.registrationsLost.Add(ctx, 1)
		return
	}
	x.leaseWrites.Add(ctx, 1, outcome(event))
	x.leaseWriteTime.Record(ctx, took.Seconds())
}

// Evicted counts a stream the gateway ended.
func (x *Metrics) Evicted(reason string) {
	x.evictions.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
}

// HistoryWrite counts a write of history items and its time.
func (x *Metrics) HistoryWrite(items int, took time.Duration, err error) {
	o := "ok"
	if err != nil {
		o = "failed"
	}
	x.historyWrites.Add(ctx, int64(items), outcome(o))
	x.historyWriteTime.Record(ctx, took.Seconds())
}

// A2ACall counts an A2A call (method: one of a fixed set) and whether it
// was served or refused before it reached the client API.
func (x *Metrics) A2ACall(method, o string) {
	x.a2aCalls.Add(ctx, 1, metric.WithAttributes(attribute.String("method", method), attribute.String("outcome", o)))
}

// A2ATask counts an A2A task that ended, by its final state.
func (x *Metrics) A2ATask(state string) {
	x.a2aTasks.Add(ctx, 1, metric.WithAttributes(attribute.String("state", state)))
}
