package otlphttp

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	cpb "go.opentelemetry.io/proto/otlp/common/v1"
	mpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	rpb "go.opentelemetry.io/proto/otlp/resource/v1"
)

// NewMetricExporter exports metrics to cfg.Endpoint + /v1/metrics, with the
// SDK's default temporality (cumulative) and aggregations. The SDK has no
// public transport interface for metrics as otlptrace has for spans, so
// the translation to the OTLP messages is here (metricPB).
func NewMetricExporter(cfg Config) (sdkmetric.Exporter, error) {
	s, err := newSender(cfg, "/v1/metrics")
	if err != nil {
		return nil, err
	}
	return &metricExporter{s: s}, nil
}

type metricExporter struct {
	s    *sender
	done atomic.Bool
}

func (*metricExporter) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (*metricExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (e *metricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	if e.done.Load() {
		return errors.New("otlphttp: metric exporter shut down")
	}
	pb, err := metricPB(rm)
	if len(pb.ScopeMetrics) > 0 {
		body, encErr := encode([]*mpb.ResourceMetrics{pb})
		if encErr != nil {
			return errors.Join(err, encErr)
		}
		err = errors.Join(err, e.s.send(ctx, body))
	}
	return err
}

// ForceFlush has nothing to do: the exporter holds nothing between exports.
func (*metricExporter) ForceFlush(ctx context.Context) error { return ctx.Err() }

func (e *metricExporter) Shutdown(ctx context.Context) error {
	e.done.Store(true)
	e.s.shutdown()
	return ctx.Err()
}

// metricPB is rm as OTLP. A metric of an aggregation it does not know is
// left out and named in the error; the others are still sent.
func metricPB(rm *metricdata.ResourceMetrics) (*mpb.ResourceMetrics, error) {
	out := &mpb.ResourceMetrics{Resource: &rpb.Resource{Attributes: attrs(rm.Resource.Iter())}, SchemaUrl: rm.Resource.SchemaURL()}
	var errs []error
	for _, sm := range rm.ScopeMetrics {
		spb := &mpb.ScopeMetrics{
			Scope:     &cpb.InstrumentationScope{Name: sm.Scope.Name, Version: sm.Scope.Version, Attributes: attrs(sm.Scope.Attributes.Iter())},
			SchemaUrl: sm.Scope.SchemaURL,
		}
		for _, m := range sm.Metrics {
			pb, err := metricOne(m)
			if err != nil {
				errs = append(errs, fmt.Errorf("otlphttp: metric %q: %w", m.Name, err))
				continue
			}
			spb.Metrics = append(spb.Metrics, pb)
		}
		out.ScopeMetrics = append(out.ScopeMetrics, spb)
	}
	return out, errors.Join(errs...)
}

func metricOne(m metricdata.Metrics) (*mpb.Metric, error) {
	out := &mpb.Metric{Name: m.Name, Description: m.Description, Unit: m.Unit}
	var err error
	switch a := m.Data.(type) {
	case metricdata.Gauge[int64]:
		out.Data = &mpb.Metric_Gauge{Gauge: &mpb.Gauge{DataPoints: numberPoints(a.DataPoints)}}
	case metricdata.Gauge[float64]:
		out.Data = &mpb.Metric_Gauge{Gauge: &mpb.Gauge{DataPoints: numberPoints(a.DataPoints)}}
	case metricdata.Sum[int64]:
		out.Data, err = sum(a)
	case metricdata.Sum[float64]:
		out.Data, err = sum(a)
	case metricdata.Histogram[int64]:
		out.Data, err = histogram(a)
	case metricdata.Histogram[float64]:
		out.Data, err = histogram(a)
	case metricdata.ExponentialHistogram[int64]:
		out.Data, err = expHistogram(a)
	case metricdata.ExponentialHistogram[float64]:
		out.Data, err = expHistogram(a)
	case metricdata.Summary:
		out.Data = summary(a)
	default:
		return nil, fmt.Errorf("unknown aggregation %T", a)
	}
	return out, err
}

func temporality(t metricdata.Temporality) (mpb.AggregationTemporality, error) {
	switch t {
	case metricdata.DeltaTemporality:
		return mpb.AggregationTemporality_AGGREGATION_TEMPORALITY_DELTA, nil
	case metricdata.CumulativeTemporality:
		return mpb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE, nil
	}
	return 0, fmt.Errorf("unknown temporality %v", t)
}

func sum[N int64 | float64](s metricdata.Sum[N]) (*mpb.Metric_Sum, error) {
	t, err := temporality(s.Temporality)
	if err != nil {
		return nil, err
	}
	return &mpb.Metric_Sum{Sum: &mpb.Sum{AggregationTemporality: t, IsMonotonic: s.IsMonotonic, DataPoints: numberPoints(s.DataPoints)}}, nil
}

func numberPoints[N int64 | float64](pts []metricdata.DataPoint[N]) []*mpb.NumberDataPoint {
	out := make([]*mpb.NumberDataPoint, 0, len(pts))
	for _, p := range pts {
		pb := &mpb.NumberDataPoint{Attributes: attrs(p.Attributes.Iter()), StartTimeUnixNano: unixNano(p.StartTime),
			TimeUnixNano: unixNano(p.Time), Exemplars: exemplars(p.Exemplars)}
		switch v := any(p.Value).(type) {
		case int64:
			pb.Value = &mpb.NumberDataPoint_AsInt{AsInt: v}
		case float64:
			pb.Value = &mpb.NumberDataPoint_AsDouble{AsDouble: v}
		}
		out = append(out, pb)
	}
	return out
}

func histogram[N int64 | float64](h metricdata.Histogram[N]) (*mpb.Metric_Histogram, error) {
	t, err := temporality(h.Temporality)
	if err != nil {
		return nil, err
	}
	pts := make([]*mpb.HistogramDataPoint, 0, len(h.DataPoints))
	for _, p := range h.DataPoints {
		sum := float64(p.Sum)
		pb := &mpb.HistogramDataPoint{Attributes: attrs(p.Attributes.Iter()), StartTimeUnixNano: unixNano(p.StartTime),
			TimeUnixNano: unixNano(p.Time), Count: p.Count, Sum: &sum, BucketCounts: p.BucketCounts, ExplicitBounds: p.Bounds,
			Exemplars: exemplars(p.Exemplars)}
		pb.Min, pb.Max = extremum(p.Min), extremum(p.Max)
		pts = append(pts, pb)
	}
	return &mpb.Metric_Histogram{Histogram: &mpb.Histogram{AggregationTemporality: t, DataPoints: pts}}, nil
}

func expHistogram[N int64 | float64](h metricdata.ExponentialHistogram[N]) (*mpb.Metric_ExponentialHistogram, error) {
	t, err := temporality(h.Temporality)
	if err != nil {
		return nil, err
	}
	pts := make([]*mpb.ExponentialHistogramDataPoint, 0, len(h.DataPoints))
	for _, p := range h.DataPoints {
		sum := float64(p.Sum)
		pb := &mpb.ExponentialHistogramDataPoint{Attributes: attrs(p.Attributes.Iter()), StartTimeUnixNano: unixNano(p.StartTime),
			TimeUnixNano: unixNano(p.Time), Count: p.Count, Sum: &sum, Scale: p.Scale, ZeroCount: p.ZeroCount,
			ZeroThreshold: p.ZeroThreshold, Exemplars: exemplars(p.Exemplars),
			Positive: &mpb.ExponentialHistogramDataPoint_Buckets{Offset: p.PositiveBucket.Offset, BucketCounts: p.PositiveBucket.Counts},
			Negative: &mpb.ExponentialHistogramDataPoint_Buckets{Offset: p.NegativeBucket.Offset, BucketCounts: p.NegativeBucket.Counts}}
		pb.Min, pb.Max = extremum(p.Min), extremum(p.Max)
		pts = append(pts, pb)
	}
	return &mpb.Metric_ExponentialHistogram{ExponentialHistogram: &mpb.ExponentialHistogram{AggregationTemporality: t, DataPoints: pts}}, nil
}

func extremum[N int64 | float64](e metricdata.Extrema[N]) *float64 {
	v, ok := e.Value()
	if !ok {
		return nil
	}
	f := float64(v)
	return &f
}

func summary(s metricdata.Summary) *mpb.Metric_Summary {
	pts := make([]*mpb.SummaryDataPoint, 0, len(s.DataPoints))
	for _, p := range s.DataPoints {
		pb := &mpb.SummaryDataPoint{Attributes: attrs(p.Attributes.Iter()), StartTimeUnixNano: unixNano(p.StartTime),
			TimeUnixNano: unixNano(p.Time), Count: p.Count, Sum: p.Sum}
		for _, q := range p.QuantileValues {
			pb.QuantileValues = append(pb.QuantileValues, &mpb.SummaryDataPoint_ValueAtQuantile{Quantile: q.Quantile, Value: q.Value})
		}
		pts = append(pts, pb)
	}
	return &mpb.Metric_Summary{Summary: &mpb.Summary{DataPoints: pts}}
}

func exemplars[N int64 | float64](es []metricdata.Exemplar[N]) []*mpb.Exemplar {
	if len(es) == 0 {
		return nil
	}
	out := make([]*mpb.Exemplar, 0, len(es))
	for _, e := range es {
		pb := &mpb.Exemplar{FilteredAttributes: keyValues(e.FilteredAttributes), TimeUnixNano: unixNano(e.Time), SpanId: e.SpanID, TraceId: e.TraceID}
		switch v := any(e.Value).(type) {
		case int64:
			pb.Value = &mpb.Exemplar_AsInt{AsInt: v}
		case float64:
			pb.Value = &mpb.Exemplar_AsDouble{AsDouble: v}
		}
		out = append(out, pb)
	}
	return out
}

func unixNano(t time.Time) uint64 { return uint64(max(0, t.UnixNano())) } //nolint:gosec // not negative

func attrs(it attribute.Iterator) []*cpb.KeyValue {
	if it.Len() == 0 {
		return nil
	}
	out := make([]*cpb.KeyValue, 0, it.Len())
	for it.Next() {
		kv := it.Attribute()
		out = append(out, &cpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func keyValues(kvs []attribute.KeyValue) []*cpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	out := make([]*cpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, &cpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *cpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &cpb.AnyValue{Value: &cpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &cpb.AnyValue{Value: &cpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &cpb.AnyValue{Value: &cpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &cpb.AnyValue{Value: &cpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BYTESLICE:
		return &cpb.AnyValue{Value: &cpb.AnyValue_BytesValue{BytesValue: v.AsByteSlice()}}
	case attribute.BOOLSLICE:
		return array(v.AsBoolSlice(), func(b bool) *cpb.AnyValue { return &cpb.AnyValue{Value: &cpb.AnyValue_BoolValue{BoolValue: b}} })
	case attribute.INT64SLICE:
		return array(v.AsInt64Slice(), func(i int64) *cpb.AnyValue { return &cpb.AnyValue{Value: &cpb.AnyValue_IntValue{IntValue: i}} })
	case attribute.FLOAT64SLICE:
		return array(v.AsFloat64Slice(), func(f float64) *cpb.AnyValue { return &cpb.AnyValue{Value: &cpb.AnyValue_DoubleValue{DoubleValue: f}} })
	case attribute.STRINGSLICE:
		return array(v.AsStringSlice(), func(s string) *cpb.AnyValue { return &cpb.AnyValue{Value: &cpb.AnyValue_StringValue{StringValue: s}} })
	case attribute.SLICE:
		return array(v.AsSlice(), anyValue)
	case attribute.MAP:
		return &cpb.AnyValue{Value: &cpb.AnyValue_KvlistValue{KvlistValue: &cpb.KeyValueList{Values: keyValues(v.AsMap())}}}
	case attribute.EMPTY:
		return &cpb.AnyValue{}
	}
	return &cpb.AnyValue{Value: &cpb.AnyValue_StringValue{StringValue: "INVALID"}}
}

func array[T any](vs []T, one func(T) *cpb.AnyValue) *cpb.AnyValue {
	out := make([]*cpb.AnyValue, len(vs))
	for i, v := range vs {
		out[i] = one(v)
	}
	return &cpb.AnyValue{Value: &cpb.AnyValue_ArrayValue{ArrayValue: &cpb.ArrayValue{Values: out}}}
}
