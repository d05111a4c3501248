package telemetry

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/conclave-ai/conclave/pkg/telemetry/convention"
)

// Domain metrics follow one convention in every deployable, so that an
// operator finds them the same way on each /metrics and in each dashboard:
//
//   - Names are conclave_<service>_<thing>; the instrument's unit adds the
//     Prometheus suffix (unit "s" gives _seconds, "By" _bytes), and a
//     counter's _total is added by the exporter. A count of things has a
//     curly-brace unit such as "{agent}", which adds no suffix.
//   - Labels come from small fixed sets (an outcome, a replica, a reason),
//     never from an agent id, token, topic, request id or anything else a
//     client chooses, so that no input can grow the number of series.
//   - Each metric has a row in docs/metrics.md: name, type, labels,
//     meaning, and the alert that watches it.
//
// The same instruments are served on /metrics by the Prometheus exporter
// and pushed over OTLP when an endpoint is configured.

// Meter returns the meter a deployable's domain metrics are made from; its
// instruments must be named MetricName(service, thing).
func (p *Provider) Meter(service string) metric.Meter {
	return p.meterProvider.Meter("github.com/conclave-ai/conclave/" + service)
}

// MetricName is a domain metric's instrument name, conclave_<service>_<thing>
// (convention.MetricName). It panics on a name outside the convention.
func MetricName(service, thing string) string { return convention.MetricName(service, thing) }
