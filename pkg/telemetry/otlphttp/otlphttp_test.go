package otlphttp_test

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/google/go-cmp/cmp"

	"github.com/conclave-ai/conclave/pkg/telemetry/otlphttp"
)

// collector records the requests an exporter sends and answers each with
// the next of its statuses (200 once they run out).
type collector struct {
	mu       sync.Mutex
	requests []recorded
	answers  []answer
}

type recorded struct {
	path   string
	header http.Header
	body   []byte // decompressed
}

type answer struct {
	status     int
	retryAfter string
	body       string
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.requests = append(c.requests, recorded{path: r.URL.Path, header: r.Header.Clone(), body: b})
	a := answer{status: http.StatusOK}
	if len(c.answers) > 0 {
		a, c.answers = c.answers[0], c.answers[1:]
	}
	c.mu.Unlock()
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.WriteHeader(a.status)
	_, _ = io.WriteString(w, a.body)
}

func (c *collector) got() []recorded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]recorded(nil), c.requests...)
}

func serve(t *testing.T, answers ...answer) (*collector, string) {
	t.Helper()
	c := &collector{answers: answers}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return c, srv.URL
}

// spans are spans with every field OTLP carries: attributes of each type,
// events, links, status, a parent, and two resources.
func spans() []sdktrace.ReadOnlySpan {
	tid := trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{9, 9, 9, 9, 9, 9, 9, 9}, TraceFlags: trace.FlagsSampled})
	start := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	attrs := []attribute.KeyValue{attribute.String("s", "v"), attribute.Int64("i", -7), attribute.Float64("f", 1.5), attribute.Bool("b", true),
		attribute.StringSlice("ss", []string{"a", "b"}), attribute.Int64Slice("is", []int64{1, 2}), attribute.Float64Slice("fs", []float64{0.5}),
		attribute.BoolSlice("bs", []bool{true, false})}
	stubs := tracetest.SpanStubs{
		{Name: "root", SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}),
			Parent: parent, SpanKind: trace.SpanKindServer, StartTime: start, EndTime: start.Add(time.Second), Attributes: attrs,
			Events: []sdktrace.Event{{Name: "e", Time: start.Add(time.Millisecond), Attributes: attrs[:2]}},
			Links:  []sdktrace.Link{{SpanContext: parent, Attributes: attrs[2:3]}}, Status: sdktrace.Status{Code: codes.Error, Description: "boom"},
			Resource: resource.NewSchemaless(attribute.String("service.name", "one")), InstrumentationScope: instrumentation.Scope{Name: "scope", Version: "1"}},
		{Name: "other", SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{2}}),
			StartTime: start, EndTime: start.Add(2 * time.Second), Resource: resource.NewSchemaless(attribute.String("service.name", "two"))},
	}
	return stubs.Snapshots()
}

// TestTraceRequestIsTheSDKs: the request this package encodes decodes, with
// the collector's own message, to what otlptracehttp sends for the same
// spans (up to the order of the resources, which otlptrace builds from a
// map).
func TestTraceRequestIsTheSDKs(t *testing.T) {
	t.Parallel()
	ours, oursURL := serve(t)
	sdk, sdkURL := serve(t)
	ctx := context.Background()
	exp, err := otlphttp.NewTraceExporter(ctx, otlphttp.Config{Endpoint: oursURL})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(sdkURL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []sdktrace.SpanExporter{exp, ref} {
		if err := e.ExportSpans(ctx, spans()); err != nil {
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
	if got[0].path != "/v1/traces" || got[0].header.Get("Content-Type") != "application/x-protobuf" {
		t.Errorf("request to %s as %s; want /v1/traces as application/x-protobuf", got[0].path, got[0].header.Get("Content-Type"))
	}
	var g, w coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(got[0].body, &g); err != nil {
		t.Fatalf("our request does not decode: %v", err)
	}
	if err := proto.Unmarshal(want[0].body, &w); err != nil {
		t.Fatal(err)
	}
	if len(g.ResourceSpans) != 2 {
		t.Fatalf("%d resources, want 2", len(g.ResourceSpans))
	}
	byResource := protocmp.SortRepeated(func(a, b *tracepb.ResourceSpans) bool { return a.String() < b.String() })
	if diff := cmp.Diff(&w, &g, protocmp.Transform(), byResource); diff != "" {
		t.Errorf("our request differs from the SDK's (-SDK +ours):\n%s", diff)
	}
}
