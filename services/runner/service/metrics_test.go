package service_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

// Every metric of docs/metrics.md's runner table moves when its event
// happens, and ids chosen by clients never become label values.
func TestMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, q := sharedState(t, nil)
	r, _ := runOn(t, cfg, st, q, nil)
	scrape := func() metricstest.Families { return metricstest.Scrape(t, r.Base+"/metrics") }
	tested := map[string]bool{}

	slow := r.Launch(t, "acp-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "x"})
	r.WaitLog(t, slow.ID, "tool_call")
	if v := scrape().Value("conclave_runner_running_agents"); v != 1 {
		t.Errorf("running_agents = %v with one agent running", v)
	}
	tested["conclave_runner_running_agents"] = true
	// A replica started now (the agent's launch is claimed) forwards
	// requests for it to r; it is stopped before anything else is
	// launched, so that r claims every later launch.
	other, stopOther := runOn(t, cfg, st, q, nil)
	if code := other.Do(t, "POST", "/api/v1/agents/"+slow.ID+"/cancel", map[string]string{"reason": "forwarded"}, nil); code != 200 {
		t.Fatalf("cancel through another replica: HTTP %d", code)
	}
	if v := metricstest.Scrape(t, other.Base+"/metrics").Value("conclave_runner_forwarded_requests_total", "method", "cancel", "outcome", "ok"); v != 1 {
		t.Errorf("forwarded_requests_total{method=cancel,outcome=ok} = %v after one forwarded cancel", v)
	}
	tested["conclave_runner_forwarded_requests_total"] = true
	// agent-host's streams exist only with the Kubernetes executor: they
	// are tested on the real node (kubetest, TestKubernetesExecutor).
	tested["conclave_runner_host_connects_total"] = true
	tested["conclave_runner_host_streams"] = true
	// Throttled wrong tokens need a runner with tokens: TestThrottlesWrongTokens.
	tested["conclave_runner_auth_throttled_total"] = true
	// The librarian permission policy's need a Librarian and a bus: they
	// are tested with both in cmd/conclave's governed tests.
	tested["conclave_runner_permission_requests_total"] = true
	tested["conclave_runner_approval_wait_seconds"] = true
	tested["conclave_runner_permission_fail_closed_total"] = true
	if err := stopOther(); err != nil {
		t.Fatal(err)
	}
	r.Do(t, "DELETE", "/api/v1/agents/"+slow.ID, nil, nil)

	junk := r.Launch(t, "acp-junk", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "x"})
	r.WaitStatus(t, junk.ID, "completed")
	crash := r.Launch(t, "acp-crash", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "x"})
	r.WaitStatus(t, crash.ID, "failed")

	// Events are sent asynchronously; wait until they are counted.
	for scrape().Value("conclave_runner_events_published_total") == 0 {
	}
	f := scrape()
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{"conclave_runner_launches_total", []string{"outcome", "started"}},
		{"conclave_runner_launches_total", []string{"outcome", "crashed"}},
		{"conclave_runner_session_updates_total", []string{"kind", "content"}},
		{"conclave_runner_session_updates_total", []string{"kind", "tool_call"}},
		{"conclave_runner_dropped_lines_total", []string{"reason", "not_json"}},
		{"conclave_runner_dropped_lines_total", []string{"reason", "not_utf8"}},
		{"conclave_runner_dropped_lines_total", []string{"reason", "line_too_long"}},
		{"conclave_runner_status_changes_total", []string{"status", "running"}},
		{"conclave_runner_status_changes_total", []string{"status", "completed"}},
		{"conclave_runner_status_changes_total", []string{"status", "failed"}},
		{"conclave_runner_events_published_total", nil},
	} {
		if v := f.Value(c.name, c.labels...); v < 1 {
			t.Errorf("%s%v = %v, want at least 1", c.name, c.labels, v)
		}
		tested[c.name] = true
	}
	// Instance and task ids are never labels: 10,000 distinct ones add no
	// series. Nothing may be running meanwhile: the idle junk agent would
	// reach its type's timeout and add launches_total{outcome="killed"}.
	r.Do(t, "DELETE", "/api/v1/agents/"+junk.ID, nil, nil)
	series := func() map[string]bool {
		out := map[string]bool{}
		for name, fam := range scrape() {
			for _, m := range fam.GetMetric() {
				out[name+fmt.Sprint(m.GetLabel())] = true
			}
		}
		return out
	}
	beforeSet := series()
	before := scrape().Series("conclave_runner_")
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 10_000; i += 8 {
				r.Do(t, "GET", fmt.Sprintf("/api/v1/agents/unknown-%d/status", i), nil, nil)
			}
		})
	}
	wg.Wait()
	if after := scrape().Series("conclave_runner_"); after != before {
		t.Errorf("10,000 instance ids grew the runner's series from %d to %d", before, after)
		for k := range series() {
			if !beforeSet[k] && strings.HasPrefix(k, "conclave_runner_") {
				t.Errorf("new series %s", k)
			}
		}
	}
	for _, name := range metricstest.DocumentedNames(t, "runner") {
		if !tested[name] {
			t.Errorf("%s is documented but not tested", name)
		}
		for _, l := range []string{"instance_id", "task_id"} {
			if vals := scrape().LabelValues(name, l); len(vals) > 0 {
				t.Errorf("%s has a %s label", name, l)
			}
		}
	}
	var names []string
	for n := range tested {
		names = append(names, n)
	}
	slices.Sort(names)
	documented := slices.Sorted(slices.Values(metricstest.DocumentedNames(t, "runner")))
	if !slices.Equal(names, documented) {
		t.Errorf("tested %v, documented %v", names, documented)
	}
}
