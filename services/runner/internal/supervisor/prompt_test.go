package supervisor

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// statusHook is Metrics that calls onStatus with each status announced, on
// the goroutine that announces it.
type statusHook struct{ onStatus func(string) }

var _ Metrics = (*statusHook)(nil)

func (h *statusHook) Launch(string)   {}
func (h *statusHook) Update(string)   {}
func (h *statusHook) Drop(string)     {}
func (h *statusHook) Status(s string) { h.onStatus(s) }
func (h *statusHook) Events(int)      {}
func (h *statusHook) Running(int)     {}

// TestPromptAsSoonAsRunning prompts an instance from inside the
// announcement of its running status, before its session goes on: a caller
// that reads running and prompts at once must have the prompt taken, not
// be told the agent is still starting (CI's TestCancelRightAfterPrompt met
// that window). The agent is a oneshot script, so that no agent process
// stands between the status and the prompt.
func TestPromptAsSoonAsRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := store.EnsureTables(ctx, st, records.Table); err != nil {
		t.Fatal(err)
	}
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	defs := []queue.Definition{{Name: "launch"}, {Name: "events"}}
	for p := 1; p <= MaxPriority; p++ {
		defs = append(defs, queue.Definition{Name: LaneQueue("launch", p)})
	}
	for _, d := range defs {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	workspace := filepath.Join(dir, "workspace")
	script := filepath.Join(dir, "agent.sh")
	if err := os.Mkdir(workspace, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("cat >/dev/null\necho '{\"status\": \"success\", \"result\": \"done\"}'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	registry, err := agenttype.New(agenttype.Type{ID: "script", Command: []string{"/bin/sh", script},
		Protocol: agenttype.ProtocolOneshot, Enabled: true, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	const id = "instance"
	prompted := make(chan error, 1)
	var (
		sup   *Supervisor
		first atomic.Bool
	)
	hook := &statusHook{onStatus: func(status string) {
		if status == records.StatusRunning && first.CompareAndSwap(false, true) {
			prompted <- sup.Prompt(ctx, id, "at once")
		}
	}}
	rec := records.New(st)
	logger := slog.New(slog.DiscardHandler)
	sup = New(Options{
		Records: rec, Queue: q, Registry: registry, Executor: &executor.Local{Roots: []string{dir}},
		LaunchQueue: "launch", EventsQueue: "events", Workers: 1, Visibility: time.Minute,
		ProtocolTimeout: time.Minute, SilenceTimeout: time.Minute, CancelGrace: time.Minute, IdleTimeout: time.Minute,
		MaxLine: 1 << 20, Source: "test", Logger: logger, Metrics: hook,
	})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- sup.Run(runCtx, "test") }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	in := &records.Instance{ID: id, TaskID: "task", AgentType: "script", Status: records.StatusStarting,
		StartedAt: time.Now().UTC(), Workspace: workspace, LaunchSeq: 1}
	if err := sup.Launch(ctx, in, func(ctx context.Context) error { return rec.CreateInstance(ctx, in) }); err != nil {
		t.Fatal(err)
	}
	if err := <-prompted; err != nil {
		t.Fatalf("a prompt sent as the status turned running: %v", err)
	}
	for {
		got, err := rec.Instance(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.TurnDone == 1 {
			if got.Status != records.StatusCompleted || got.Turn != 1 {
				t.Fatalf("after the prompt's turn: %+v", got)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
