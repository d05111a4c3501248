package handler

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/conclave-ai/conclave/pkg/telemetry/convention"
)

// metrics are the Librarian's domain metrics (docs/metrics.md). Every
// label comes from a fixed set: request types and statuses are checked
// before they are counted, HTTP codes are the API's few.
type metrics struct {
	decisions  metric.Int64Counter
	validation metric.Float64Histogram
	refusals   metric.Int64Counter
	published  metric.Int64Counter
	throttled  metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	// The meter telemetry.Provider.Meter("librarian") names.
	m := mp.Meter("github.com/conclave-ai/conclave/librarian")
	var out metrics
	var err error
	if out.decisions, err = m.Int64Counter(convention.MetricName("librarian", "decisions"), metric.WithUnit("{request}"),
		metric.WithDescription("Requests decided by the validation pipeline, by request type and status.")); err != nil {
		return nil, err
	}
	if out.validation, err = m.Float64Histogram(convention.MetricName("librarian", "validation_duration"), metric.WithUnit("s"),
		metric.WithDescription("Time the validation pipeline took to decide a request."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)); err != nil {
		return nil, err
	}
	if out.refusals, err = m.Int64Counter(convention.MetricName("librarian", "refusals"), metric.WithUnit("{request}"),
		metric.WithDescription("Requests answered with an HTTP error, by status code.")); err != nil {
		return nil, err
	}
	if out.published, err = m.Int64Counter(convention.MetricName("librarian", "events_published"), metric.WithUnit("{event}"),
		metric.WithDescription("Governance events sent to the queue, by outcome (sent, or staged for a retry).")); err != nil {
		return nil, err
	}
	if out.throttled, err = m.Int64Counter(convention.MetricName("librarian", "auth_throttled"), metric.WithUnit("{request}"),
		metric.WithDescription("Requests refused because their address presented too many wrong tokens.")); err != nil {
		return nil, err
	}
	return &out, nil
}

// AuthThrottled counts a request refused by the throttle of wrong tokens.
func (m *metrics) AuthThrottled(ctx context.Context) { m.throttled.Add(ctx, 1) }

func (m *metrics) Decided(ctx context.Context, requestType, status string, validation time.Duration) {
	m.decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("request_type", requestType), attribute.String("status", status)))
	m.validation.Record(ctx, validation.Seconds())
}

func (m *metrics) Refused(ctx context.Context, code int) {
	m.refusals.Add(ctx, 1, metric.WithAttributes(attribute.String("code", strconv.Itoa(code))))
}

func (m *metrics) Published(ctx context.Context, n int, err error) {
	outcome := "sent"
	if err != nil {
		outcome = "staged"
	}
	m.published.Add(ctx, int64(n), metric.WithAttributes(attribute.String("outcome", outcome)))
}
