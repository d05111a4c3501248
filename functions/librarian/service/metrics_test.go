package service_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

// TestMetrics drives every event of docs/metrics.md's librarian table and
// checks each metric moved, that the table and the test cover the same
// metrics, and that 10,000 distinct request ids add no series.
func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "librarian-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(ctx) }()
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queue.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	if err := q.Ensure(ctx, service.EventsQueue); err != nil {
		t.Fatal(err)
	}
	lib, err := service.NewHandler(service.Config{APIRate: "100000/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second, AgentTokens: []string{"copilot-2=" + copilotToken},
		// No regrowth within the test, however loaded the machine.
		AuthThrottle: auth.ThrottleSetting{Burst: auth.ThrottleBurst, Every: time.Hour}},
		service.Deps{Store: st, Queue: q, Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+copilotToken)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		lib.Handler.ServeHTTP(rec, req)
		return rec.Code
	}
	query := `{"agent_id":"copilot-2","request_type":"QUERY","content":"auth"}`
	tested := map[string]func(f metricstest.Families) float64{
		"conclave_librarian_decisions_total": func(f metricstest.Families) float64 {
			return f.Value("conclave_librarian_decisions_total", "request_type", "QUERY", "status", "approved")
		},
		"conclave_librarian_validation_duration_seconds": func(f metricstest.Families) float64 {
			return f.Value("conclave_librarian_validation_duration_seconds")
		},
		"conclave_librarian_refusals_total": func(f metricstest.Families) float64 {
			return f.Value("conclave_librarian_refusals_total", "code", "404")
		},
		"conclave_librarian_auth_throttled_total": func(f metricstest.Families) float64 {
			return f.Value("conclave_librarian_auth_throttled_total")
		},
		"conclave_librarian_events_published_total": func(f metricstest.Families) float64 {
			return f.Value("conclave_librarian_events_published_total", "outcome", "sent") + 10*f.Value("conclave_librarian_events_published_total", "outcome", "staged")
		},
	}
	before := metricstest.ScrapeHandler(t, tel.MetricsHandler())
	if code := call("POST", "/agent/request", query); code != http.StatusOK {
		t.Fatalf("query: %d", code)
	}
	if code := call("GET", "/agent/status/req-aaaaaaaaaaaaaaaa", ""); code != http.StatusNotFound {
		t.Fatalf("status: %d", code)
	}
	// 10,000 distinct tokens and request ids, all refused: one series.
	// Each comes from an address of its own, which the throttle of wrong
	// tokens therefore lets through.
	for i := range 10000 {
		req := httptest.NewRequest("GET", fmt.Sprintf("/agent/status/req-%016d", i), nil)
		req.RemoteAddr = fmt.Sprintf("10.0.%d.%d:40000", i/256, i%256)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer lib_%016x_%043d", i, i))
		rec := httptest.NewRecorder()
		lib.Handler.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("status with a made-up token: %d", rec.Code)
		}
	}
	// Wrong tokens from one address, until it is throttled: 429 with
	// Retry-After, the right token included.
	for i := range auth.ThrottleBurst + 2 {
		req := httptest.NewRequest("GET", "/agent/capabilities", nil)
		req.RemoteAddr = "198.51.100.7:40000"
		tok := "lib_0000000000000000_" + strings.Repeat("w", 43)
		if i == auth.ThrottleBurst+1 {
			tok = copilotToken
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		lib.Handler.ServeHTTP(rec, req)
		want := http.StatusUnauthorized
		if i >= auth.ThrottleBurst {
			want = http.StatusTooManyRequests
		}
		if rec.Code != want || (want == http.StatusTooManyRequests && rec.Header().Get("Retry-After") == "") {
			t.Fatalf("request %d from one address: %d, Retry-After %q; want %d", i+1, rec.Code, rec.Header().Get("Retry-After"), want)
		}
	}
	// With the queue gone, events stay staged.
	_ = q.Close()
	if code := call("POST", "/agent/request", query); code != http.StatusOK {
		t.Fatalf("query with the queue down: %d", code)
	}
	after := metricstest.ScrapeHandler(t, tel.MetricsHandler())
	for name, value := range tested {
		if value(after) <= value(before) {
			t.Errorf("%s did not move", name)
		}
	}
	if after.Value("conclave_librarian_events_published_total", "outcome", "staged") != 2 {
		t.Errorf("staged events: %v", after.Value("conclave_librarian_events_published_total", "outcome", "staged"))
	}
	if codes := after.LabelValues("conclave_librarian_refusals_total", "code"); len(codes) != 3 {
		t.Errorf("10,000 tokens and request ids made refusal series with codes %v, want 3 (401, 404 and the throttle's 429)", codes)
	}
	names := make([]string, 0, len(tested))
	for n := range tested {
		names = append(names, n)
	}
	documented := metricstest.DocumentedNames(t, "librarian")
	slices.Sort(names)
	slices.Sort(documented)
	if !slices.Equal(names, documented) {
		t.Fatalf("tested %v, documented %v", names, documented)
	}
}
