package otlphttp_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/conclave-ai/conclave/pkg/telemetry/otlphttp"
)

// resourceMetrics holds every aggregation the SDK produces, with exemplars,
// extrema and attributes of every type.
func resourceMetrics() *metricdata.ResourceMetrics {
	t0 := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute)
	set := attribute.NewSet(attribute.String("route", "/v1/requests"), attribute.Int("code", 200), attribute.Bool("b", true),
		attribute.Float64("f", 0.25), attribute.StringSlice("ss", []string{"x"}), attribute.Int64Slice("is", []int64{3}),
		attribute.Float64Slice("fs", []float64{1}), attribute.BoolSlice("bs", []bool{false}))
	ex := []metricdata.Exemplar[float64]{{FilteredAttributes: []attribute.KeyValue{attribute.String("k", "v")}, Time: t1, Value: 2.5,
		SpanID: []byte{1, 2, 3, 4, 5, 6, 7, 8}, TraceID: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}}
	exi := []metricdata.Exemplar[int64]{{Time: t1, Value: 3}}
	return &metricdata.ResourceMetrics{
		Resource: resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0", attribute.String("service.name", "librarian")),
		ScopeMetrics: []metricdata.ScopeMetrics{{
			Scope: instrumentation.Scope{Name: "scope", Version: "1", SchemaURL: "https://example/schema", Attributes: attribute.NewSet(attribute.String("a", "b"))},
			Metrics: []metricdata.Metrics{
				{Name: "gauge.int", Unit: "1", Data: metricdata.Gauge[int64]{DataPoints: []metricdata.DataPoint[int64]{{Attributes: set, Time: t1, Value: 4, Exemplars: exi}}}},
				{Name: "gauge.float", Data: metricdata.Gauge[float64]{DataPoints: []metricdata.DataPoint[float64]{{Time: t1, Value: 0.5}}}},
				{Name: "sum.int", Description: "requests", Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true,
					DataPoints: []metricdata.DataPoint[int64]{{Attributes: set, StartTime: t0, Time: t1, Value: 12}}}},
				{Name: "sum.float", Data: metricdata.Sum[float64]{Temporality: metricdata.DeltaTemporality,
					DataPoints: []metricdata.DataPoint[float64]{{StartTime: t0, Time: t1, Value: -1.5, Exemplars: ex}}}},
				{Name: "hist.float", Unit: "s", Data: metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality,
					DataPoints: []metricdata.HistogramDataPoint[float64]{{Attributes: set, StartTime: t0, Time: t1, Count: 3, Bounds: []float64{0.1, 1},
						BucketCounts: []uint64{1, 1, 1}, Min: metricdata.NewExtrema(0.05), Max: metricdata.NewExtrema(2.0), Sum: 2.6, Exemplars: ex}}}},
				{Name: "hist.int", Data: metricdata.Histogram[int64]{Temporality: metricdata.DeltaTemporality,
					DataPoints: []metricdata.HistogramDataPoint[int64]{{StartTime: t0, Time: t1, Count: 1, Bounds: []float64{10}, BucketCounts: []uint64{1, 0}, Sum: 7}}}},
				{Name: "exp.float", Data: metricdata.ExponentialHistogram[float64]{Temporality: metricdata.CumulativeTemporality,
					DataPoints: []metricdata.ExponentialHistogramDataPoint[float64]{{Attributes: set, StartTime: t0, Time: t1, Count: 4, Min: metricdata.NewExtrema(0.5),
						Max: metricdata.NewExtrema(8.0), Sum: 12, Scale: 2, ZeroCount: 1, ZeroThreshold: 0.001,
						PositiveBucket: metricdata.ExponentialBucket{Offset: 1, Counts: []uint64{1, 2}}, NegativeBucket: metricdata.ExponentialBucket{Offset: -1, Counts: []uint64{0}}}}}},
				{Name: "exp.int", Data: metricdata.ExponentialHistogram[int64]{Temporality: metricdata.DeltaTemporality,
					DataPoints: []metricdata.ExponentialHistogramDataPoint[int64]{{StartTime: t0, Time: t1, Count: 1, Sum: 3, Scale: 0,
						PositiveBucket: metricdata.ExponentialBucket{Counts: []uint64{1}}, Exemplars: exi}}}},
				{Name: "summary", Data: metricdata.Summary{DataPoints: []metricdata.SummaryDataPoint{{Attributes: set, StartTime: t0, Time: t1, Count: 2, Sum: 3,
					QuantileValues: []metricdata.QuantileValue{{Quantile: 0.5, Value: 1}, {Quantile: 1, Value: 2}}}}}},
			},
		}},
	}
}

// TestMetricRequestIsTheSDKs: for every aggregation, the request this
// package builds decodes, with the collector's own message, to exactly
// what otlpmetrichttp sends for the same data.
func TestMetricRequestIsTheSDKs(t *testing.T) {
	t.Parallel()
	ours, oursURL := serve(t)
	sdk, sdkURL := serve(t)
	ctx := context.Background()
	exp, err := otlphttp.NewMetricExporter(otlphttp.Config{Endpoint: oursURL})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(sdkURL+"/v1/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []sdkmetric.Exporter{exp, ref} {
		if err := e.Export(ctx, resourceMetrics()); err != nil {
			t.Fatal(err)
		}
		if err := e.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, want := ours.got(), sdk.got()
	if len(got) != 1 || len(want) != 1 {
		t.Fatalf("requests: ours %d, the SDK's %d; want 1 each", len(got), len(want))
	}
	if got[0].path != "/v1/metrics" {
		t.Errorf("request to %s, want /v1/metrics", got[0].path)
	}
	var g, w colmetricspb.ExportMetricsServiceRequest
	if err := proto.Unmarshal(got[0].body, &g); err != nil {
		t.Fatalf("our request does not decode: %v", err)
	}
	if err := proto.Unmarshal(want[0].body, &w); err != nil {
		t.Fatal(err)
	}
	if n := len(g.GetResourceMetrics()[0].GetScopeMetrics()[0].GetMetrics()); n != 9 {
		t.Errorf("%d metrics sent, want 9", n)
	}
	if diff := cmp.Diff(&w, &g, protocmp.Transform()); diff != "" {
		t.Errorf("our request differs from the SDK's (-SDK +ours):\n%s", diff)
	}
	if err := exp.Export(ctx, resourceMetrics()); err == nil {
		t.Error("an export after Shutdown succeeded")
	}
}

// TestMetricExporterSelectors: the SDK's defaults (cumulative), as
// otlpmetrichttp has them without OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE.
func TestMetricExporterSelectors(t *testing.T) {
	t.Parallel()
	exp, err := otlphttp.NewMetricExporter(otlphttp.Config{Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []sdkmetric.InstrumentKind{sdkmetric.InstrumentKindCounter, sdkmetric.InstrumentKindHistogram, sdkmetric.InstrumentKindObservableGauge} {
		if got := exp.Temporality(k); got != metricdata.CumulativeTemporality {
			t.Errorf("temporality of %v: %v, want cumulative", k, got)
		}
		if got, want := exp.Aggregation(k), sdkmetric.DefaultAggregationSelector(k); !reflect.DeepEqual(got, want) {
			t.Errorf("aggregation of %v: %v, want %v", k, got, want)
		}
	}
}
