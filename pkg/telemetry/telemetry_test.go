package telemetry_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// newRecordingProvider returns a provider whose spans land in the returned
// recorder, the way other packages' tests can observe a whole flow.
func newRecordingProvider(t *testing.T) (*telemetry.Provider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	p, err := telemetry.New(context.Background(), telemetry.Config{
		ServiceName:    "test",
		SpanProcessors: []sdktrace.SpanProcessor{rec},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return p, rec
}

// remoteSpanContext is a sampled span context as if received from another
// service, with trace state so that carriers must forward tracestate too.
func remoteSpanContext(t testing.TB) trace.SpanContext {
	t.Helper()
	ts, err := trace.ParseTraceState("conclave=1")
	if err != nil {
		t.Fatal(err)
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: ts,
		Remote:     true,
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  telemetry.Config
	}{
		{name: "no service name", cfg: telemetry.Config{}},
		{name: "negative ratio", cfg: telemetry.Config{ServiceName: "s", SampleRatio: -0.1}},
		{name: "ratio above one", cfg: telemetry.Config{ServiceName: "s", SampleRatio: 1.5}},
		{name: "bad endpoint scheme", cfg: telemetry.Config{ServiceName: "s", OTLPEndpoint: "ftp://collector:4317"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if p, err := telemetry.New(context.Background(), tt.cfg); err == nil {
				_ = p.Shutdown(context.Background())
				t.Fatalf("New(%+v) succeeded, want error", tt.cfg)
			}
		})
	}
}

func TestTracingOffIsNonRecording(t *testing.T) {
	t.Parallel()
	p, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "off"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "op")
	defer span.End()
	if span.IsRecording() {
		t.Error("span is recording with no OTLP endpoint")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestTracingOffForwardsContext checks that a service with tracing off still
// passes its caller's trace context on, so it does not split the trace of
// services around it.
func TestTracingOffForwardsContext(t *testing.T) {
	t.Parallel()
	p, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "off"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })

	got := make(chan trace.SpanContext, 1)
	srv := httptest.NewServer(p.HTTPHandler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- trace.SpanContextFromContext(r.Context())
	}), "op"))
	defer srv.Close()

	want := remoteSpanContext(t)
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), want)
	client := &http.Client{Transport: p.HTTPTransport(srv.Client().Transport)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	_ = resp.Body.Close()

	sc := <-got
	if sc.TraceID() != want.TraceID() || sc.SpanID() != want.SpanID() {
		t.Errorf("server saw %s/%s, want %s/%s", sc.TraceID(), sc.SpanID(), want.TraceID(), want.SpanID())
	}
	if sc.TraceState().String() != want.TraceState().String() {
		t.Errorf("server saw tracestate %q, want %q", sc.TraceState(), want.TraceState())
	}
}

func TestTracingOnWithEndpoint(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1, so every export fails: Shutdown must still
	// return once its context ends instead of retrying forever.
	p, err := telemetry.New(context.Background(), telemetry.Config{
		ServiceName:  "on",
		OTLPEndpoint: "http://127.0.0.1:1",
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	_, span := p.TracerProvider().Tracer("test").Start(context.Background(), "op")
	if !span.IsRecording() {
		t.Error("span is not recording with an OTLP endpoint set")
	}
	span.End()

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	first := p.Shutdown(ctx)
	if first != nil && !errors.Is(first, context.DeadlineExceeded) {
		t.Errorf("Shutdown: %v, want nil or deadline exceeded", first)
	}
	if second := p.Shutdown(context.Background()); !errors.Is(second, first) {
		t.Errorf("second Shutdown = %v, want the first result %v", second, first)
	}
}

// TestSetupInstallsGlobals is not parallel: it is the only test that
// touches OpenTelemetry's globals, and it restores them.
func TestSetupInstallsGlobals(t *testing.T) {
	prevTP, prevMP, prevProp := otel.GetTracerProvider(), otel.GetMeterProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		otel.SetTextMapPropagator(prevProp)
	})

	p, err := telemetry.Setup(context.Background(), telemetry.Config{ServiceName: "global"})
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })

	if otel.GetTracerProvider() != p.TracerProvider() {
		t.Error("global tracer provider is not the provider's")
	}
	if otel.GetMeterProvider() != p.MeterProvider() {
		t.Error("global meter provider is not the provider's")
	}
	fields := otel.GetTextMapPropagator().Fields()
	for _, want := range []string{"traceparent", "tracestate", "baggage"} {
		if !slices.Contains(fields, want) {
			t.Errorf("global propagator fields %v lack %q", fields, want)
		}
	}
}

func TestMetricsHandler(t *testing.T) {
	t.Parallel()
	p, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "metrics"})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })

	counter, err := p.MeterProvider().Meter("test").Int64Counter("conclave.test.requests")
	if err != nil {
		t.Fatal(err)
	}
	counter.Add(context.Background(), 3)

	rr := httptest.NewRecorder()
	p.MetricsHandler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rr.Code != http.StatusOK {
		t.Fatalf("status %d", rr.Code)
	}
	if ct := rr.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want Prometheus text format", ct)
	}

	body := rr.Body.String()
	samples := map[string]string{} // metric name -> value of its last sample
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		samples[name] = line[strings.LastIndexByte(line, ' ')+1:]
	}
	tests := []struct {
		metric string
		value  string // empty: any value
	}{
		{metric: "conclave_test_requests_total", value: "3"},
		{metric: "go_goroutines"},
		{metric: "process_start_time_seconds"},
	}
	for _, tt := range tests {
		got, ok := samples[tt.metric]
		if !ok {
			t.Errorf("metric %s missing from:\n%s", tt.metric, body)
			continue
		}
		if tt.value != "" && got != tt.value {
			t.Errorf("metric %s = %s, want %s", tt.metric, got, tt.value)
		}
	}
}
