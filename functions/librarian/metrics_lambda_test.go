package main_test

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

// otlpReceiver is an OTLP/HTTP endpoint collecting the names of the
// metrics it is sent, standing in for the collector extension a Lambda
// exports to. It refuses a request without its token, and takes gzip.
type otlpReceiver struct {
	mu      sync.Mutex
	metrics map[string]bool
	changed chan struct{}
	token   string
	gzipped bool
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Header.Get("Authorization") != "Bearer "+r.token {
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	var in io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		in = zr
		r.mu.Lock()
		r.gzipped = true
		r.mu.Unlock()
	}
	body, err := io.ReadAll(in)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.URL.Path == "/v1/metrics" {
		var export colmetricspb.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rm := range export.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					r.metrics[m.Name] = true
				}
			}
		}
		r.mu.Unlock()
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (r *otlpReceiver) has(names []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.gzipped {
		return false
	}
	for _, n := range names {
		if !r.metrics[n] {
			return false
		}
	}
	return true
}

// TestMetricsOverOTLP: the Lambda has no /metrics to scrape; it pushes
// every documented librarian metric over OTLP/HTTP (flushed at the end of
// each invocation, before Lambda could freeze the environment), with the
// headers and compression of OTEL_EXPORTER_OTLP_HEADERS and
// OTEL_EXPORTER_OTLP_COMPRESSION.
func TestMetricsOverOTLP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary against dynalite and fauxqs")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recv := &otlpReceiver{metrics: map[string]bool{}, changed: make(chan struct{}, 1), token: "otlp token/0123"}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	env, _, _, _ := deployment(t)
	rt := startFunction(t, append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL,
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20otlp%20token%2F0123", "OTEL_EXPORTER_OTLP_COMPRESSION=gzip",
		// No regrowth within the test, however loaded the machine.
		"CONCLAVE_LIBRARIAN_AUTH_THROTTLE="+strconv.Itoa(auth.ThrottleBurst)+"/1h"))
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// An approval is decided (decisions, validation_duration) and publishes
	// its events (events_published); malformed JSON is refused (refusals).
	for _, f := range []string{"request-approval.json", "request-malformed.json"} {
		if _, err := rt.Invoke(ctx, fixture(t, f), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Wrong tokens from one address, until the instance throttles it
	// (auth_throttled).
	wrong := strings.ReplaceAll(string(fixture(t, "request-malformed.json")), "claude-3-sam-local-token-0123", "wrong-token-0123456789")
	for range auth.ThrottleBurst + 1 {
		if _, err := rt.Invoke(ctx, []byte(wrong), nil); err != nil {
			t.Fatal(err)
		}
	}
	// The OTLP instrument names: Prometheus adds _total and the unit.
	var want []string
	for _, name := range metricstest.DocumentedNames(t, "librarian") {
		name = strings.TrimSuffix(strings.TrimSuffix(name, "_total"), "_seconds")
		want = append(want, name)
	}
	slices.Sort(want)
	for !recv.has(want) {
		select {
		case <-recv.changed:
		case <-ctx.Done():
			recv.mu.Lock()
			defer recv.mu.Unlock()
			t.Fatalf("received %v (gzipped: %v), want %v\n%s", recv.metrics, recv.gzipped, want, rt.Output())
		}
	}
	if strings.Contains(rt.Output(), recv.token) {
		t.Errorf("the Lambda's output shows the OTLP token:\n%s", rt.Output())
	}
}
