package otlphttp_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/telemetry/otlphttp"
)

const secret = "Bearer sekrit-0123456789"

// fast retries in microseconds, so that a test of several attempts waits
// for nothing.
var fast = otlphttp.Retry{Initial: time.Microsecond, Max: time.Microsecond, MaxElapsed: time.Minute}

func export(t *testing.T, cfg otlphttp.Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exp, err := otlphttp.NewTraceExporter(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Shutdown(ctx)
	return exp.ExportSpans(ctx, spans())
}

func TestExportTransport(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		answers  []answer
		cfg      otlphttp.Config
		requests int
		// errHas is what the error must say; "" for success.
		errHas []string
	}{
		{name: "retries 503 and 429, then succeeds", answers: []answer{{status: 503, retryAfter: "0"}, {status: 429, body: "slow down"}, {status: 502}, {status: 504}},
			cfg: otlphttp.Config{Retry: fast}, requests: 5},
		{name: "400 is not retried", answers: []answer{{status: 400, body: "bad span"}}, cfg: otlphttp.Config{Retry: fast}, requests: 1,
			errHas: []string{"400", `"bad span"`}},
		{name: "401 does not show the headers", answers: []answer{{status: 401}}, requests: 1,
			cfg: otlphttp.Config{Retry: fast, Headers: map[string]string{"Authorization": secret}}, errHas: []string{"401", "(empty body)"}},
		{name: "a Retry-After past the retry budget gives up at once", answers: []answer{{status: 503, retryAfter: "3600"}}, requests: 1,
			cfg: otlphttp.Config{Retry: fast}, errHas: []string{"giving up", "503"}},
		{name: "an HTTP-date Retry-After past the budget too", answers: []answer{{status: 429, retryAfter: time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}},
			requests: 1, cfg: otlphttp.Config{Retry: fast}, errHas: []string{"giving up", "429"}},
		{name: "retries stop at the budget", answers: []answer{{status: 503}, {status: 503}, {status: 503}}, requests: 1,
			cfg: otlphttp.Config{Retry: otlphttp.Retry{Initial: time.Hour, Max: time.Hour, MaxElapsed: time.Second}}, errHas: []string{"giving up"}},
		{name: "no retry when disabled", answers: []answer{{status: 503}}, requests: 1,
			cfg: otlphttp.Config{Retry: otlphttp.Retry{Disabled: true}}, errHas: []string{"503"}},
		{name: "a request over the size limit is not sent", cfg: otlphttp.Config{MaxRequestSize: 64}, requests: 0,
			errHas: []string{"larger than the limit of 64"}},
		{name: "gzip and headers", cfg: otlphttp.Config{Gzip: true, Headers: map[string]string{"Authorization": secret, "X-Tenant": "a"}}, requests: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, url := serve(t, tt.answers...)
			cfg := tt.cfg
			cfg.Endpoint = url
			err := export(t, cfg)
			got := c.got()
			if len(got) != tt.requests {
				t.Errorf("%d requests, want %d", len(got), tt.requests)
			}
			if len(tt.errHas) == 0 && err != nil {
				t.Fatalf("export failed: %v", err)
			}
			if len(tt.errHas) > 0 {
				if err == nil {
					t.Fatal("export succeeded")
				}
				for _, want := range tt.errHas {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				if strings.Contains(err.Error(), "sekrit") {
					t.Errorf("error %q shows a header's value", err)
				}
			}
			for _, r := range got {
				for k, v := range cfg.Headers {
					if r.header.Get(k) != v {
						t.Errorf("header %s = %q, want the configured value", k, r.header.Get(k))
					}
				}
				if gz := r.header.Get("Content-Encoding") == "gzip"; gz != cfg.Gzip {
					t.Errorf("gzip %v, want %v", gz, cfg.Gzip)
				}
				var req coltracepb.ExportTraceServiceRequest
				if err := proto.Unmarshal(r.body, &req); err != nil || len(req.ResourceSpans) != 2 {
					t.Errorf("request does not decode to 2 resources: %v", err)
				}
			}
		})
	}
}

// TestShutdownStopsRetrying: Lambda gives the shutdown 500 ms; an export
// waiting to retry must not hold it.
func TestShutdownStopsRetrying(t *testing.T) {
	t.Parallel()
	c, url := serve(t, answer{status: 503, retryAfter: "30"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exp, err := otlphttp.NewTraceExporter(ctx, otlphttp.Config{Endpoint: url})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- exp.ExportSpans(ctx, spans()) }()
	for len(c.got()) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the exporter never sent its first request")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := exp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Error("the export succeeded")
		}
	case <-ctx.Done():
		t.Fatal("the export kept waiting to retry after Shutdown")
	}
	var _ sdktrace.SpanExporter = exp
}

func TestBadEndpointIsNotQuoted(t *testing.T) {
	t.Parallel()
	for _, ep := range []string{"ftp://user:sekrit@host", "http://", "user:sekrit@host:4318", "::"} {
		_, err := otlphttp.NewMetricExporter(otlphttp.Config{Endpoint: ep})
		if err == nil {
			t.Errorf("endpoint %q accepted", ep)
		} else if strings.Contains(err.Error(), "sekrit") {
			t.Errorf("error %q quotes the endpoint", err)
		}
	}
}

func TestSettings(t *testing.T) {
	t.Parallel()
	var h otlphttp.Headers
	if err := h.EnvDecode("authorization=Bearer%20sekrit, x-tenant = a%2Cb ,"); err != nil {
		t.Fatal(err)
	}
	if h["Authorization"] != "Bearer sekrit" || h["X-Tenant"] != "a,b" || len(h) != 2 {
		t.Errorf("headers %v", h)
	}
	for _, bad := range []string{"novalue", "bad name=sekrit", "x=sekrit%0d%0aInjected: 1", "x=%zzsekrit"} {
		var h otlphttp.Headers
		err := h.EnvDecode(bad)
		if err == nil {
			t.Errorf("headers %q accepted", bad)
		} else if strings.Contains(err.Error(), "sekrit") {
			t.Errorf("error %q shows the value", err)
		}
	}
	var ms otlphttp.TimeoutMillis
	if err := ms.EnvDecode("2500"); err != nil || time.Duration(ms) != 2500*time.Millisecond {
		t.Errorf("timeout 2500: %v, %v", time.Duration(ms), err)
	}
	for _, bad := range []string{"0", "-1", "10s", ""} {
		if err := ms.EnvDecode(bad); err == nil {
			t.Errorf("timeout %q accepted", bad)
		}
	}
	var c otlphttp.Compression
	if err := c.EnvDecode("GZIP"); err != nil || !c.Gzip() {
		t.Errorf("compression gzip: %v, %v", c, err)
	}
	if err := c.EnvDecode("zstd"); err == nil {
		t.Error("compression zstd accepted")
	}
}

// TestClosedConnectionIsNotRetried: a collector that drops the connection
// (or is not there) fails the export at once, as with the SDK, rather than
// retrying until the budget runs out.
func TestClosedConnectionIsNotRetried(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	err = export(t, otlphttp.Config{Endpoint: "http://" + l.Addr().String(),
		Retry: otlphttp.Retry{Initial: time.Millisecond, Max: time.Millisecond, MaxElapsed: 2 * time.Second}})
	if err == nil {
		t.Fatal("the export succeeded")
	}
	// net/http itself retries an idempotent-looking request once on a
	// fresh connection it lost before any response; more than that is a
	// retry of ours.
	if n := accepted.Load(); n > 2 {
		t.Errorf("%d connections for one export; want it not retried", n)
	}
}
