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
	"github.com/conclave-ai/conclave/pkg/testenv"
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

// openRecords is the runner's records on an embedded store of the test's
// own.
func openRecords(t *testing.T) *records.Records {
	t.Helper()
	return records.New(testenv.EmbeddedStore(t, records.Table))
}

// openQueues is an embedded queue of the test's own with the named queues.
func openQueues(t *testing.T, names ...string) *queue.Embedded {
	t.Helper()
	q, err := queue.OpenEmbedded(filepath.Join(t.TempDir(), "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	for _, n := range names {
		if err := q.Ensure(context.Background(), queue.Definition{Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

// laneQueues names the launch queue's lanes above priority 0.
func laneQueues(launch string) []string {
	var names []string
	for p := 1; p <= MaxPriority; p++ {
		names = append(names, LaneQueue(launch, p))
	}
	return names
}

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
	rec := openRecords(t)
	q := openQueues(t, append([]string{"launch", "events"}, laneQueues("launch")...)...)
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
	var got *records.Instance
	testenv.Eventually(t, time.Minute, "the prompt's turn to end", func() bool {
		var err error
		if got, err = rec.Instance(ctx, id); err != nil {
			t.Fatal(err)
		}
		return got.TurnDone == 1
	})
	if got.Status != records.StatusCompleted || got.Turn != 1 {
		t.Fatalf("after the prompt's turn: %+v", got)
	}
}
