package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// zeroStartProvider hands out meters whose counters and gauges are exported
// from the moment they are made, at zero, rather than from their first
// count: an alert on "no agents connected" or "no requests" must be able to
// fire on a replica that never had one, and a rate needs a first sample.
// Each such instrument gets one series without labels at zero; its
// labelled series appear as they are counted. Histograms are left alone: a
// zero observation would be a false one.
type zeroStartProvider struct {
	metric.MeterProvider
}

func (p zeroStartProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return zeroStartMeter{p.MeterProvider.Meter(name, opts...)}
}

type zeroStartMeter struct {
	metric.Meter
}

func (m zeroStartMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	c, err := m.Meter.Int64Counter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 0)
	}
	return c, err
}

func (m zeroStartMeter) Float64Counter(name string, opts ...metric.Float64CounterOption) (metric.Float64Counter, error) {
	c, err := m.Meter.Float64Counter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 0)
	}
	return c, err
}

func (m zeroStartMeter) Int64UpDownCounter(name string, opts ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	c, err := m.Meter.Int64UpDownCounter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 0)
	}
	return c, err
}

func (m zeroStartMeter) Float64UpDownCounter(name string, opts ...metric.Float64UpDownCounterOption) (metric.Float64UpDownCounter, error) {
	c, err := m.Meter.Float64UpDownCounter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 0)
	}
	return c, err
}

func (m zeroStartMeter) Int64Gauge(name string, opts ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	g, err := m.Meter.Int64Gauge(name, opts...)
	if err == nil {
		g.Record(context.Background(), 0)
	}
	return g, err
}

func (m zeroStartMeter) Float64Gauge(name string, opts ...metric.Float64GaugeOption) (metric.Float64Gauge, error) {
	g, err := m.Meter.Float64Gauge(name, opts...)
	if err == nil {
		g.Record(context.Background(), 0)
	}
	return g, err
}
