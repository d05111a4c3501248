package service_test

import (
	"context"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestPriority: with the only worker busy, launches of priorities 0, 2, 1,
// 3 and 0 wait; once it is free they start highest priority first (3, 2,
// 1, then both 0s), on the embedded queue and on SQS (fauxqs). The order is
// read from when each launch's agent started, one after the other.
func TestPriority(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes and fauxqs")
	}
	t.Parallel()
	for _, backend := range []string{"embedded", "sqs"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			cfg, st, q := sharedState(t, map[string]string{"CONCLAVE_RUNNER_WORKERS": "1", "CONCLAVE_RUNNER_IDLE_TIMEOUT": "1ms"})
			var launches queue.Queue = q
			if backend == "sqs" {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				fauxqs, err := testenv.Fauxqs(ctx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(fauxqs.Stop)
				launches = queue.NewSQS(testenv.AWSConfig(), fauxqs.Endpoint)
			}
			r, _ := runOn(t, cfg, st, launches, nil)
			busy := r.Launch(t, "acp-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "hold the only worker"})
			r.WaitLogWithin(t, busy.ID, "tool_call write notes.txt", time.Minute)

			byID := map[string]string{}
			for _, l := range []struct {
				name     string
				priority int
			}{{"a0", 0}, {"b2", 2}, {"c1", 1}, {"d3", 3}, {"e0", 0}} {
				var in instance
				if code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
					"task_id": "priority-" + backend + "-" + l.name, "agent_type": "acp-normal", "workspace_path": r.workspace(t),
					"env": map[string]string{"TASK_DESCRIPTION": l.name}, "priority": l.priority,
				}, &in); code != http.StatusOK {
					t.Fatalf("launch %s: HTTP %d", l.name, code)
				}
				byID[in.ID] = l.name
			}
			for id, name := range byID {
				if st := r.Status(t, id); st.Status != "starting" {
					t.Fatalf("%s should wait for the busy worker: %+v", name, st)
				}
			}
			r.Do(t, "POST", "/api/v1/agents/"+busy.ID+"/cancel", map[string]string{"reason": "free the worker"}, nil)

			type start struct {
				name string
				at   time.Time
			}
			var starts []start
			for id, name := range byID {
				if done := r.WaitStatus(t, id, "completed", "failed"); done.Status != "completed" {
					t.Fatalf("%s: %+v", name, done)
				}
				r.WaitLogWithin(t, id, "started acp-normal", time.Minute)
				var out struct {
					Lines []struct {
						Time time.Time `json:"time"`
						Text string    `json:"text"`
					} `json:"lines"`
				}
				r.Do(t, "GET", "/api/v1/agents/"+id+"/logs?tail=1000", nil, &out)
				for _, l := range out.Lines {
					if strings.HasPrefix(l.Text, "started acp-normal") {
						starts = append(starts, start{name, l.Time})
					}
				}
			}
			sort.Slice(starts, func(i, j int) bool { return starts[i].at.Before(starts[j].at) })
			var order []string
			for _, s := range starts {
				order = append(order, s.name)
			}
			if len(order) != 5 || !slices.Equal(order[:3], []string{"d3", "b2", "c1"}) {
				t.Fatalf("launches started in the order %v, want d3 b2 c1 then a0 and e0", order)
			}
		})
	}
}

// TestPriorityRange: a priority outside 0 to 3 is a validation_error.
func TestPriorityRange(t *testing.T) {
	t.Parallel()
	r := startRunner(t, nil)
	for _, p := range []int{-1, 4} {
		var e errorBody
		code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
			"task_id": "priority-range", "agent_type": "acp-normal", "workspace_path": r.workspace(t), "priority": p,
		}, &e)
		if code != http.StatusBadRequest || e.Error != "validation_error" || !strings.Contains(e.Message, "priority") {
			t.Errorf("priority %d: HTTP %d %+v", p, code, e)
		}
	}
}
