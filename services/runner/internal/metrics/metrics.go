// Package metrics is the runner's domain metrics, named and labelled by the
// convention in docs/metrics.md: every label value comes from a fixed set.
package metrics

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Metrics implements supervisor.Metrics.
type Metrics struct {
	launches     metric.Int64Counter
	updates      metric.Int64Counter
	drops        metric.Int64Counter
	statuses     metric.Int64Counter
	events       metric.Int64Counter
	running      metric.Int64UpDownCounter
	forwards     metric.Int64Counter
	hostConnects metric.Int64Counter
	hostStreams  metric.Int64UpDownCounter
	permissions  metric.Int64Counter
	approvalWait metric.Float64Histogram
	failClosed   metric.Int64Counter
}

// New makes the instruments from m.
func New(m metric.Meter) *Metrics {
	name := func(thing string) string { return telemetry.MetricName("runner", thing) }
	out := &Metrics{}
	out.launches, _ = m.Int64Counter(name("launches_total"), metric.WithDescription("Launches handled by a worker, by outcome."))
	out.updates, _ = m.Int64Counter(name("session_updates_total"), metric.WithDescription("session/update notifications and legacy lines received from agents, by kind."))
	out.drops, _ = m.Int64Counter(name("dropped_lines_total"), metric.WithDescription("Lines or messages from agents dropped, by reason."))
	out.statuses, _ = m.Int64Counter(name("status_changes_total"), metric.WithDescription("Instance status changes, by new status."))
	out.events, _ = m.Int64Counter(name("events_published_total"), metric.WithDescription("Event envelopes sent to the events queue."))
	out.running, _ = m.Int64UpDownCounter(name("running_agents"), metric.WithDescription("Agent processes this replica runs."))
	out.forwards, _ = m.Int64Counter(name("forwarded_requests_total"), metric.WithDescription("Requests for instances another replica runs, forwarded to it, by method and outcome."))
	out.hostConnects, _ = m.Int64Counter(name("host_connects_total"), metric.WithDescription("agent-host streams opened to this replica (Kubernetes executor), by outcome."))
	out.hostStreams, _ = m.Int64UpDownCounter(name("host_streams"), metric.WithDescription("agent-host streams attached to a launch on this replica."))
	out.permissions, _ = m.Int64Counter(name("permission_requests_total"), metric.WithDescription("Permission requests of agents under the librarian policy, by outcome."))
	out.approvalWait, _ = m.Float64Histogram(name("approval_wait_seconds"), metric.WithUnit("s"),
		metric.WithDescription("Time permission requests the Librarian escalated waited for a person, by outcome."),
		metric.WithExplicitBucketBoundaries(1, 5, 15, 60, 300, 900, 3600, 4*3600, 24*3600))
	out.failClosed, _ = m.Int64Counter(name("permission_fail_closed_total"), metric.WithDescription("Permission requests refused because the Librarian could not answer, by reason."))
	return out
}

var bg = context.Background()

// Launch outcomes are a fixed set: started, completed, exited, crashed,
// killed, cancelled, dead_protocol, start_failed, bad_type, duplicate,
// gone, unreadable.
func (m *Metrics) Launch(outcome string) {
	m.launches.Add(bg, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// Update kinds are acp.Kind* constants.
func (m *Metrics) Update(kind string) {
	m.updates.Add(bg, 1, metric.WithAttributes(attribute.String("kind", kind)))
}

// Drop reasons are acp.Drop* constants.
func (m *Metrics) Drop(reason string) {
	m.drops.Add(bg, 1, metric.WithAttributes(attribute.String("reason", reason)))
}

// Status values are the five instance statuses.
func (m *Metrics) Status(status string) {
	m.statuses.Add(bg, 1, metric.WithAttributes(attribute.String("status", status)))
}

// Events counts envelopes sent.
func (m *Metrics) Events(n int) { m.events.Add(bg, int64(n)) }

// Running moves the running-agents gauge.
func (m *Metrics) Running(delta int) { m.running.Add(bg, int64(delta)) }

// Forwarded methods are api.Forward{Prompt,Cancel,Delete}, outcomes
// api.Forward{OK,Error,Unreachable}.
func (m *Metrics) Forwarded(method, outcome string) {
	m.forwards.Add(bg, 1, metric.WithAttributes(attribute.String("method", method), attribute.String("outcome", outcome)))
}

// HostConnect outcomes are hostlink's: accepted, unauthenticated, no_hello,
// invalid, not_expected, refused, unavailable.
func (m *Metrics) HostConnect(outcome string) {
	m.hostConnects.Add(bg, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// HostStreams moves the attached agent-host streams gauge.
func (m *Metrics) HostStreams(delta int) { m.hostStreams.Add(bg, int64(delta)) }

// Asked counts a permission request under the librarian policy; outcomes
// are govern's: approved, rejected, clarification_needed, timeout,
// unavailable, refused, cancelled.
func (m *Metrics) Asked(outcome string) {
	m.permissions.Add(bg, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// Waited records how long an escalated request waited for a person.
func (m *Metrics) Waited(d time.Duration, outcome string) {
	m.approvalWait.Record(bg, d.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}

// FailedClosed counts a refusal made because the Librarian could not
// answer: reasons unavailable (unreachable or failing) and refused (it
// refused to take the request).
func (m *Metrics) FailedClosed(reason string) {
	m.failClosed.Add(bg, 1, metric.WithAttributes(attribute.String("reason", reason)))
}
