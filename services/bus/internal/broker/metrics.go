package broker

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Metrics are the bus's domain metrics (docs/metrics.md, ## bus). Labels
// come from fixed sets only; topics and client ids never become labels.
type Metrics struct {
	connGauge        metric.Int64UpDownCounter
	subsGauge        metric.Int64UpDownCounter
	deliveryLatency  metric.Float64Histogram
	publishedTotal   metric.Int64Counter
	deliveriesTotal  metric.Int64Counter
	retriesTotal     metric.Int64Counter
	deadLettersTotal metric.Int64Counter
	spawnsTotal      metric.Int64Counter
}

// NewMetrics makes the instruments from the bus's meter.
func NewMetrics(m metric.Meter) (*Metrics, error) {
	var (
		out Metrics
		err error
	)
	name := func(thing string) string { return telemetry.MetricName("bus", thing) }
	if out.connGauge, err = m.Int64UpDownCounter(name("connections"), metric.WithUnit("{connection}"),
		metric.WithDescription("WebSocket connections open")); err != nil {
		return nil, err
	}
	if out.subsGauge, err = m.Int64UpDownCounter(name("subscriptions"), metric.WithUnit("{subscription}"),
		metric.WithDescription("subscriptions held by the connections open on this replica")); err != nil {
		return nil, err
	}
	if out.deliveryLatency, err = m.Float64Histogram(name("delivery_latency"), metric.WithUnit("s"),
		metric.WithDescription("time from a message's publish to a subscriber's answer, by method"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)); err != nil {
		return nil, err
	}
	if out.publishedTotal, err = m.Int64Counter(name("messages_published"), metric.WithUnit("{message}"),
		metric.WithDescription("sendMessage calls accepted or rejected, by outcome")); err != nil {
		return nil, err
	}
	if out.deliveriesTotal, err = m.Int64Counter(name("deliveries"), metric.WithUnit("{delivery}"),
		metric.WithDescription("deliveries to subscribers, by method and outcome")); err != nil {
		return nil, err
	}
	if out.retriesTotal, err = m.Int64Counter(name("retries_scheduled"), metric.WithUnit("{message}"),
		metric.WithDescription("agent deliveries scheduled for another attempt")); err != nil {
		return nil, err
	}
	if out.deadLettersTotal, err = m.Int64Counter(name("dead_letters"), metric.WithUnit("{message}"),
		metric.WithDescription("messages moved to the dead-letter table, by reason")); err != nil {
		return nil, err
	}
	if out.spawnsTotal, err = m.Int64Counter(name("agent_spawns"), metric.WithUnit("{agent}"),
		metric.WithDescription("agents the default handler asked the runner to launch, by outcome")); err != nil {
		return nil, err
	}
	return &out, nil
}

func nopMetrics() *Metrics {
	m, _ := NewMetrics(noop.NewMeterProvider().Meter("")) // noop instruments cannot fail
	return m
}

func (m *Metrics) connected(delta int64) { m.connGauge.Add(context.Background(), delta) }

func (m *Metrics) subscribed(delta int64) { m.subsGauge.Add(context.Background(), delta) }

// answered records how long a subscriber's answer took from the publish.
func (m *Metrics) answered(ctx context.Context, method string, since time.Time) {
	opts := deliveryLatencyProcess
	if method == MethodSendMessage {
		opts = deliveryLatencySend
	}
	m.deliveryLatency.Record(ctx, time.Since(since).Seconds(), opts...)
}

// The label sets of the hot paths, made once: WithAttributes would
// allocate on every call. They are kept as the option slices the
// instruments take, as passing one option alone makes a slice per call.
var (
	deliveryLatencySend    = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("method", MethodSendMessage)))}
	deliveryLatencyProcess = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("method", MethodProcessMessage)))}
)

func (m *Metrics) published(ctx context.Context, outcome string) {
	m.publishedTotal.Add(ctx, 1, labelSet("outcome", outcome)...)
}

func (m *Metrics) delivered(ctx context.Context, method, outcome string) {
	m.deliveriesTotal.Add(ctx, 1, labelSet("method", method, "outcome", outcome)...)
}

// labelSets holds the label sets of the metrics recorded per message, made
// once each: a fresh set would allocate on every delivery. Their values
// come from fixed sets, so it stays small.
var labelSets struct {
	sync.RWMutex
	m map[[4]string][]metric.AddOption
}

// labelSet returns the set of up to two name, value pairs, as the options
// of a counter's Add. The slice is shared: it must not be changed.
func labelSet(kv ...string) []metric.AddOption {
	var key [4]string
	copy(key[:], kv)
	labelSets.RLock()
	o, ok := labelSets.m[key]
	labelSets.RUnlock()
	if ok {
		return o
	}
	attrs := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		attrs = append(attrs, attribute.String(kv[i], kv[i+1]))
	}
	o = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
	labelSets.Lock()
	if labelSets.m == nil {
		labelSets.m = map[[4]string][]metric.AddOption{}
	}
	labelSets.m[key] = o
	labelSets.Unlock()
	return o
}

func (m *Metrics) retried(ctx context.Context) { m.retriesTotal.Add(ctx, 1) }

func (m *Metrics) deadLettered(ctx context.Context, reason string) {
	m.deadLettersTotal.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
}

func (m *Metrics) spawned(ctx context.Context, outcome string) {
	m.spawnsTotal.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}
