// Package metrics is the console's domain metrics, named and labelled by
// the convention in docs/metrics.md: every label value comes from a fixed
// set, never from a user, topic or id.
package metrics

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Stream kinds: the console's live connections to browsers.
const (
	StreamAgents = "agents"
	StreamChat   = "chat"
	StreamBus    = "bus"
	StreamLogs   = "logs"
)

// Refusal reasons.
const (
	RefusedCSRF    = "csrf"
	RefusedExpired = "expired_session"
	RefusedSignIn  = "signin"
	RefusedBusy    = "busy"
)

// Metrics are the console's instruments; make them with New, or Discard.
type Metrics struct {
	calls    metric.Int64Counter
	streams  metric.Int64UpDownCounter
	refusals metric.Int64Counter
}

// New registers the instruments on m.
func New(m metric.Meter) *Metrics {
	calls, _ := m.Int64Counter(telemetry.MetricName("console", "backend_calls"),
		metric.WithDescription("calls from the console to the services' APIs, by service and outcome (ok, unauthorized, rejected, unavailable)"))
	streams, _ := m.Int64UpDownCounter(telemetry.MetricName("console", "streams"), metric.WithUnit("{stream}"),
		metric.WithDescription("live Server-Sent Event streams open to browsers, by kind (agents, chat, bus, logs)"))
	refusals, _ := m.Int64Counter(telemetry.MetricName("console", "refusals"),
		metric.WithDescription("requests the console refused, by reason (csrf, expired_session, signin, busy)"))
	return &Metrics{calls: calls, streams: streams, refusals: refusals}
}

// Discard is Metrics that record nothing.
func Discard() *Metrics { return New(noop.NewMeterProvider().Meter("")) }

// Call counts one call to a service.
func (m *Metrics) Call(service, outcome string) {
	m.calls.Add(context.Background(), 1, metric.WithAttributes(attribute.String("service", service), attribute.String("outcome", outcome)))
}

// Stream counts a stream opening; call the result when it closes.
func (m *Metrics) Stream(kind string) func() {
	attrs := metric.WithAttributes(attribute.String("kind", kind))
	m.streams.Add(context.Background(), 1, attrs)
	return func() { m.streams.Add(context.Background(), -1, attrs) }
}

// Refused counts one refused request.
func (m *Metrics) Refused(reason string) {
	m.refusals.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", reason)))
}
