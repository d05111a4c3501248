package service_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

func metricsValue(t testing.TB, b *httpBridge, name string, labels ...string) float64 {
	t.Helper()
	return metricstest.Scrape(t, b.metrics).Value(name, labels...)
}

// Every metric of docs/metrics.md's bridge table moves when its event
// happens, and no input grows the number of series.
func TestMetrics(t *testing.T) {
	t.Parallel()
	// 10,000 calls below, as fast as the machine goes: no rate limit.
	b := startHTTP(t, func(c *serviceConfig) { c.Rate, c.Burst = 1e9, 1e9 })
	cs := connectHTTP(t, b, nil)
	ctx := context.Background()
	call := func(tool string, args map[string]any) {
		t.Helper()
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args}); err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
	}
	tested := map[string]bool{}
	scrape := func() metricstest.Families { return metricstest.Scrape(t, b.metrics) }

	// agents_running: 1 while a slow agent runs.
	done := make(chan struct{})
	go func() { defer close(done); call("slow", map[string]any{}) }()
	for running := false; !running; {
		select {
		case <-done:
			t.Fatal("the slow call ended before conclave_bridge_agents_running showed it")
		default:
		}
		running = scrape().Value("conclave_bridge_agents_running") == 1
	}
	<-done
	tested["conclave_bridge_agents_running"] = true
	if v := scrape().Value("conclave_bridge_agents_running"); v != 0 {
		t.Errorf("agents_running = %v after the call", v)
	}

	call("label_github_issue", map[string]any{"repo_name": "a/b", "issue_number": 1})
	call("hang", map[string]any{})
	call("always_fails", map[string]any{})
	call("label_github_issue", map[string]any{"repo_name": "a b", "issue_number": 1})
	call("label_github_issue", map[string]any{"repo_name": "a/b", "issue_number": 0})
	call("watch_collect", map[string]any{"repo_name": "a/b", "sources": []string{"x"}})
	call("echo", map[string]any{"query": strings.Repeat("q", 10_001)})
	call("label_github_issue", map[string]any{"repo_name": "a/b"})

	f := scrape()
	for _, tt := range []struct {
		name   string
		labels []string
	}{
		{"conclave_bridge_tool_calls_total", []string{"tool", "label_github_issue", "outcome", "success"}},
		{"conclave_bridge_tool_calls_total", []string{"tool", "hang", "outcome", "timeout"}},
		{"conclave_bridge_tool_calls_total", []string{"tool", "always_fails", "outcome", "execution"}},
		{"conclave_bridge_tool_calls_total", []string{"tool", "label_github_issue", "outcome", "validation"}},
		{"conclave_bridge_tool_call_duration_seconds", []string{"tool", "slow", "outcome", "success"}},
		{"conclave_bridge_tool_call_duration_seconds", []string{"tool", "hang", "outcome", "timeout"}},
		{"conclave_bridge_validation_failures_total", []string{"rule", "repo_name"}},
		{"conclave_bridge_validation_failures_total", []string{"rule", "issue_number"}},
		{"conclave_bridge_validation_failures_total", []string{"rule", "sources"}},
		{"conclave_bridge_validation_failures_total", []string{"rule", "string_length"}},
		{"conclave_bridge_validation_failures_total", []string{"rule", "params"}},
	} {
		if v := f.Value(tt.name, tt.labels...); v < 1 {
			t.Errorf("%s%v = %v, want at least 1", tt.name, tt.labels, v)
		}
		tested[tt.name] = true
	}

	// 10,000 distinct parameter values and unknown tool names add no
	// series.
	before := f.Series("conclave_bridge_")
	for i := range 10_000 {
		args := map[string]any{"repo_name": fmt.Sprintf("bad repo %d", i), "issue_number": i}
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "label_github_issue", Arguments: args}); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: fmt.Sprintf("tool-%d", i), Arguments: args}); err == nil {
				t.Fatal("an unknown tool was called")
			}
		}
	}
	if after := scrape().Series("conclave_bridge_"); after != before {
		t.Errorf("series grew from %d to %d with distinct inputs", before, after)
	}

	// Requests refused for too many wrong tokens: TestThrottlesWrongTokens,
	// on a bridge of its own (the throttle would refuse this test's calls).
	tested["conclave_bridge_auth_throttled_total"] = true

	// Governed tools' need a Librarian and a bus: they are tested with
	// both in cmd/conclave (TestGovernedBridgeTools).
	for _, n := range []string{"conclave_bridge_approvals_total", "conclave_bridge_approval_wait_seconds", "conclave_bridge_approval_fail_closed_total"} {
		tested[n] = true
	}
	var names []string
	for n := range tested {
		names = append(names, n)
	}
	slices.Sort(names)
	documented := metricstest.DocumentedNames(t, "bridge")
	slices.Sort(documented)
	if !slices.Equal(names, documented) {
		t.Errorf("metrics tested %v, documented %v", names, documented)
	}
}
