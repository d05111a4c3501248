package telemetry

import (
	"context"

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
	return p.MeterProvider().Meter("github.com/conclave-ai/conclave/" + service)
}

// MetricName is a domain metric's instrument name, conclave_<service>_<thing>
// (convention.MetricName). It panics on a name outside the convention.
func MetricName(service, thing string) string { return convention.MetricName(service, thing) }

// AuthThrottled makes service's counter of requests refused because their
// address had presented too many wrong tokens,
// conclave_<service>_auth_throttled_total, and returns what counts one
// (auth.ThrottleOptions.Throttled). Every service that checks tokens keeps
// it.
func AuthThrottled(m metric.Meter, service string) func(context.Context) {
	// Creation fails only on an invalid name, which MetricName rules out.
	c, _ := m.Int64Counter(MetricName(service, "auth_throttled"), metric.WithUnit("{request}"),
		metric.WithDescription("Requests refused because their address presented too many wrong tokens."))
	return func(ctx context.Context) { c.Add(ctx, 1) }
}
