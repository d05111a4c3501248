package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

// The convention's names reach /metrics as documented: a counter gains
// _total, a unit of seconds _seconds, a curly-brace unit nothing.
func TestDomainMetricNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	m := tel.Meter("widget")
	spins, _ := m.Int64Counter(telemetry.MetricName("widget", "spins"), metric.WithUnit("{spin}"))
	open, _ := m.Int64UpDownCounter(telemetry.MetricName("widget", "open"), metric.WithUnit("{widget}"))
	took, _ := m.Float64Histogram(telemetry.MetricName("widget", "spin_duration"), metric.WithUnit("s"))
	// Never counted: exported anyway, at zero, so that an alert on it can
	// fire on a process that never saw one.
	_, _ = m.Int64Counter(telemetry.MetricName("widget", "jams"), metric.WithUnit("{jam}"))
	_, _ = m.Int64UpDownCounter(telemetry.MetricName("widget", "queued"), metric.WithUnit("{widget}"))
	spins.Add(ctx, 2, metric.WithAttributes(attribute.String("outcome", "ok")))
	spins.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", "failed")))
	open.Add(ctx, 3)
	took.Record(ctx, 0.25)

	got := metricstest.ScrapeHandler(t, tel.MetricsHandler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"conclave_widget_spins_total", nil, 3},
		{"conclave_widget_spins_total", []string{"outcome", "failed"}, 1},
		{"conclave_widget_open", nil, 3},
		{"conclave_widget_spin_duration_seconds", nil, 1},
	} {
		if v := got.Value(c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	// One per outcome, and the zero series without labels it started with.
	if n := got.Series("conclave_widget_spins"); n != 3 {
		t.Errorf("spins has %d series, want 3 (one per outcome, and its zero start)", n)
	}
	for _, name := range []string{"conclave_widget_jams_total", "conclave_widget_queued"} {
		if !got.Has(name) || got.Value(name) != 0 {
			t.Errorf("%s, never counted: exported %v at %v, want exported at 0", name, got.Has(name), got.Value(name))
		}
	}
}

func TestMetricNameRejectsOtherForms(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ service, thing string }{{"Gateway", "x"}, {"gateway", "Agents"}, {"gate-way", "x"}, {"gateway", ""}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("MetricName(%q, %q) did not panic", c.service, c.thing)
				}
			}()
			_ = telemetry.MetricName(c.service, c.thing)
		}()
	}
	if got := telemetry.MetricName("gateway", "agents_connected"); got != "conclave_gateway_agents_connected" {
		t.Errorf("MetricName = %q", got)
	}
}
