package service_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// prompt sends a prompt and fails the test unless it is accepted.
func (r *testRunner) prompt(t *testing.T, id, message string) {
	t.Helper()
	var ok struct{ Accepted bool }
	if code := r.Do(t, "POST", "/api/v1/agents/"+id+"/prompt", map[string]string{"message": message}, &ok); code != http.StatusOK || !ok.Accepted {
		t.Fatalf("prompt %q: HTTP %d %+v", message, code, ok)
	}
}

// cancelToEnd cancels instance id and returns its status once it has ended
// (within WaitStatus's deadline).
func (r *testRunner) cancelToEnd(t *testing.T, id, reason string) runnertest.Instance {
	t.Helper()
	r.Do(t, "POST", "/api/v1/agents/"+id+"/cancel", map[string]string{"reason": reason}, nil)
	return r.WaitStatus(t, id, "stopped", "failed", "completed")
}

// waitLogCount polls the logs until want appears n times.
func (r *testRunner) waitLogCount(t *testing.T, id, want string, n int) {
	t.Helper()
	testenv.EventuallyNoError(t, runnertest.DefaultWaitTimeout, fmt.Sprintf("%d log lines %q of %s", n, want, id), func() error {
		if lines := r.Logs(t, id); countLogs(lines, want) < n {
			return fmt.Errorf("the log: %+v", lines)
		}
		return nil
	})
}

// TestRunnerKilledMidConversation kills the runner (SIGKILL) with one
// instance idle after its turn and another in the middle of its second
// turn. The next runner runs only what was pending: the second turn again,
// not the first; and for the idle one, nothing.
func TestRunnerKilledMidConversation(t *testing.T) {
	ps := newProcessState(t)
	first, r := ps.start(t, 2)

	idle := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "only once"})
	if st := r.WaitStatus(t, idle.ID, "completed", "failed", "stopped"); st.Status != "completed" {
		t.Fatalf("the idle instance's turn: %+v", st)
	}
	talking := r.Launch(t, "acp-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "turn one"})
	r.WaitLog(t, talking.ID, "tool_call write notes.txt")
	if st := r.cancelToEnd(t, talking.ID, "next"); st.Status != "stopped" {
		t.Fatalf("turn one after cancel: %+v", st)
	}
	r.prompt(t, talking.ID, "turn two")
	r.waitLogCount(t, talking.ID, "tool_call write notes.txt", 2)
	killRunner(t, first)

	_, r = ps.start(t, 2)
	r.WaitLog(t, idle.ID, "launch 1 ended: delivered again with no prompt pending")
	if n := countLogs(r.Logs(t, idle.ID), "started acp-normal"); n != 1 {
		t.Errorf("the idle instance's agent started %d times, want 1", n)
	}
	if st := r.Status(t, idle.ID); st.Status != "completed" {
		t.Errorf("the idle instance after the restart: %+v", st)
	}
	r.waitLogCount(t, talking.ID, "Working on: turn two", 2)
	if n := countLogs(r.Logs(t, talking.ID), "Working on: turn one"); n != 1 {
		t.Errorf("the finished first turn ran %d times, want 1", n)
	}
	if st := r.cancelToEnd(t, talking.ID, "done"); st.Status != "stopped" {
		t.Errorf("turn two after cancel: %+v", st)
	}
}

// gatedExecutor holds each Start until released (or its context ends).
type gatedExecutor struct {
	executor.Executor
	starting chan struct{}
	release  chan struct{}
}

func (g *gatedExecutor) Start(ctx context.Context, spec executor.Spec, stderr io.Writer) (executor.Process, error) {
	g.starting <- struct{}{}
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Executor.Start(ctx, spec, stderr)
}

// TestStopWhileStarting cancels or deletes an instance whose agent is being
// started: no agent runs, and the instance ends stopped (or is gone).
func TestStopWhileStarting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	for _, tt := range []struct {
		name   string
		method string
		path   string
		want   int // HTTP status of GET .../status afterwards
	}{
		{"cancel", "POST", "/cancel", http.StatusOK},
		{"delete", "DELETE", "", http.StatusNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, st, q := sharedState(t, nil)
			gate := &gatedExecutor{Executor: &executor.Local{Roots: cfg.WorkspaceRoots}, starting: make(chan struct{}, 1), release: make(chan struct{})}
			r, _ := runOnWith(t, cfg, st, q, nil, gate)
			in := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "never"})
			select {
			case <-gate.starting:
			case <-time.After(time.Minute):
				t.Fatal("the agent's start did not begin within a minute")
			}
			if code := r.Do(t, tt.method, "/api/v1/agents/"+in.ID+tt.path, map[string]string{"reason": "changed my mind"}, nil); code != http.StatusOK {
				t.Fatalf("%s: HTTP %d", tt.name, code)
			}
			close(gate.release)
			if tt.want == http.StatusNotFound {
				if code := r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/status", nil, nil); code != http.StatusNotFound {
					t.Fatalf("status after delete: HTTP %d", code)
				}
				return
			}
			if st := r.WaitStatus(t, in.ID, "stopped", "failed", "completed"); st.Status != "stopped" {
				t.Fatalf("status %+v", st)
			}
			r.WaitLog(t, in.ID, "launch 1 ended (cancelled")
			if lines := r.Logs(t, in.ID); runnertest.HasLog(lines, "started acp-normal") || runnertest.HasLog(lines, "Working on") {
				t.Errorf("an agent ran: %+v", lines)
			}
		})
	}
}

// TestCancelOfAnAgentNotReadingStdin: the agent stops reading its stdin, so
// the next prompt's write blocks. A cancel must still answer at once, and
// the grace kill end the turn stopped.
func TestCancelOfAnAgentNotReadingStdin(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	in := r.Launch(t, "kandev-deaf", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "one"})
	if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
		t.Fatalf("first turn: %+v", st)
	}
	// Far more than a pipe holds.
	r.prompt(t, in.ID, strings.Repeat("x", 200<<10))
	var c struct{ Status string }
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "stuck"}, &c); code != http.StatusOK {
		t.Fatalf("cancel: HTTP %d", code)
	}
	if st := r.WaitStatus(t, in.ID, "stopped", "failed", "completed"); st.Status != "stopped" {
		t.Fatalf("after cancel: %+v; logs %+v", st, r.Logs(t, in.ID))
	}
	r.WaitLog(t, in.ID, "ignored session/cancel")
}

// TestCancelRightAfterPrompt cancels each prompt as soon as it is accepted,
// many times: whether the cancel comes before the prompt reaches the agent
// or after, the turn ends without the agent being killed.
func TestCancelRightAfterPrompt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	in := r.Launch(t, "acp-slow-tool", r.workspace(t), nil)
	r.WaitStatus(t, in.ID, "running")
	for i := range 10 {
		r.prompt(t, in.ID, "prompt")
		r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "at once"}, nil)
		st := r.WaitStatus(t, in.ID, "stopped", "failed", "completed")
		if st.Status != "stopped" {
			t.Fatalf("round %d: %+v", i, st)
		}
	}
	lines := r.Logs(t, in.ID)
	if runnertest.HasLog(lines, "ignored session/cancel") || countLogs(lines, "started acp-slow-tool") != 1 {
		t.Fatalf("the agent was killed or restarted: %+v", lines)
	}
}

// TestIdleAgentThatWillNotExit: an agent killed because it would not exit
// after its idle session ended keeps its last turn's status.
func TestIdleAgentThatWillNotExit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "500ms", "CONCLAVE_RUNNER_CANCEL_GRACE": "500ms"})
	in := r.Launch(t, "acp-linger", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "short"})
	r.WaitLog(t, in.ID, "launch 1 ended")
	lines := r.Logs(t, in.ID)
	if st := r.Status(t, in.ID); st.Status != "completed" || !runnertest.HasLog(lines, "launch 1 ended (killed: did not exit after its stdin closed)") {
		t.Fatalf("status %+v; logs %+v", st, lines)
	}
}

// TestPromptAsTheAgentStops: a prompt that comes while the agent is going
// away after its idle timeout (here, for the grace period, as it lingers)
// is accepted and resumes the session once the launch has ended, rather
// than being refused with "retry". The prompt came within the grace
// period: the lingering agent is waited for the whole 2 s.
func TestPromptAsTheAgentStops(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "300ms", "CONCLAVE_RUNNER_CANCEL_GRACE": "2s"})
	in := r.Launch(t, "acp-linger", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "first"})
	r.WaitLog(t, in.ID, "lingering on purpose")
	r.prompt(t, in.ID, "second")
	r.WaitLog(t, in.ID, "launch 2 ended")
	lines := r.Logs(t, in.ID)
	if !runnertest.HasLog(lines, "launch 1 ended (killed: did not exit after its stdin closed)") || !runnertest.HasLog(lines, "acp-agent: loaded session") {
		t.Fatalf("logs %+v", lines)
	}
	if st := r.Status(t, in.ID); st.Status != "completed" {
		t.Fatalf("status %+v; logs %+v", st, lines)
	}
}

// TestOrphanHoldingStdout: an agent that exits leaving a process of its own
// session holding its stdout and stderr still ends its launch, as crashed,
// rather than hanging until the type's timeout.
func TestOrphanHoldingStdout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	in := r.Launch(t, "acp-orphan", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "leave"})
	r.WaitLog(t, in.ID, "left orphan")
	st := r.WaitStatus(t, in.ID, "failed", "completed", "stopped")
	lines := r.Logs(t, in.ID)
	if st.Status != "failed" || runnertest.HasLog(lines, "timed out") {
		t.Fatalf("status %+v; logs %+v", st, lines)
	}
	// The orphan is not ours to kill (it left the group); end it here.
	for _, l := range lines {
		var pid int
		if _, err := fmt.Sscanf(l.Text, "acp-agent: left orphan %d", &pid); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// countingQueue reports deletes of one instance's launch messages.
type countingQueue struct {
	queue.Queue
	launches, instanceID string
	deletes              chan struct{}
	receipts             chan string
}

func (c *countingQueue) Receive(ctx context.Context, name string, opts queue.ReceiveOptions) ([]queue.Message, error) {
	msgs, err := c.Queue.Receive(ctx, name, opts)
	for _, m := range msgs {
		if name == c.launches && strings.Contains(string(m.Body), c.instanceID) {
			c.receipts <- m.ReceiptHandle
		}
	}
	return msgs, err
}

func (c *countingQueue) Delete(ctx context.Context, name, receipt string) error {
	err := c.Queue.Delete(ctx, name, receipt)
	if name == c.launches {
		c.deletes <- struct{}{}
	}
	return err
}

// TestDuplicateLaunchRunsOnce: two runners on one store and queue each get
// a copy of the same launch. One runs it; the other drops its copy.
func TestDuplicateLaunchRunsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, embedded := sharedState(t, nil)
	const id = "dup0dup0dup0dup0dup0dup0dup0dup0"
	q := &countingQueue{Queue: embedded, launches: cfg.LaunchQueue, instanceID: id, deletes: make(chan struct{}, 16), receipts: make(chan string, 16)}
	one, _ := runOn(t, cfg, st, q, nil)
	runOn(t, cfg, st, q, nil)
	ctx := context.Background()
	in := &records.Instance{ID: id, TaskID: "task-dup", AgentType: "acp-slow-tool", Status: records.StatusStarting,
		StartedAt: time.Now().UTC(), Workspace: one.workspace(t), Turn: 1, Prompt: "once", LaunchSeq: 1}
	if err := records.New(st).CreateInstance(ctx, in); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"instance_id":"` + id + `","seq":1}`)
	if _, err := embedded.Send(ctx, cfg.LaunchQueue, queue.Outgoing{Body: body}, queue.Outgoing{Body: body}); err != nil {
		t.Fatal(err)
	}
	<-q.receipts
	<-q.receipts
	// The copy that lost the claim is deleted while the other still runs.
	<-q.deletes
	one.WaitLog(t, id, "tool_call write notes.txt")
	if n := countLogs(one.Logs(t, id), "started acp-slow-tool"); n != 1 {
		t.Fatalf("the launch started %d times, want 1", n)
	}
	one.Do(t, "POST", "/api/v1/agents/"+id+"/cancel", map[string]string{"reason": "done"}, nil)
	if st := one.WaitStatus(t, id, "stopped", "failed", "completed"); st.Status != "stopped" {
		t.Fatalf("after cancel: %+v", st)
	}
}

// failingQueue refuses sends to the launch queues (every priority's) while
// fail is set.
type failingQueue struct {
	queue.Queue
	launches string
	fail     atomic.Bool
}

func (f *failingQueue) Send(ctx context.Context, name string, msgs ...queue.Outgoing) ([]string, error) {
	if strings.HasPrefix(name, f.launches) && f.fail.Load() {
		return nil, errors.New("queue unavailable (test)")
	}
	return f.Queue.Send(ctx, name, msgs...)
}

// TestQueueOutageLeavesNothingHalfDone: a launch or a resumption that
// cannot be queued fails, and leaves no instance (or no instance stuck
// starting) behind.
func TestQueueOutageLeavesNothingHalfDone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, embedded := sharedState(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "300ms"})
	q := &failingQueue{Queue: embedded, launches: cfg.LaunchQueue}
	r, _ := runOn(t, cfg, st, q, nil)

	q.fail.Store(true)
	var e errorBody
	if code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{"task_id": "task-outage", "agent_type": "acp-normal", "workspace_path": r.workspace(t)}, &e); code != http.StatusInternalServerError || e.Error != "internal_error" {
		t.Fatalf("launch with the queue down: HTTP %d %+v", code, e)
	}
	if code := r.Do(t, "GET", "/api/v1/tasks/task-outage", nil, nil); code != http.StatusNotFound {
		t.Fatalf("a launch that failed left its task: HTTP %d", code)
	}

	q.fail.Store(false)
	in := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "first"})
	r.WaitLog(t, in.ID, "launch 1 ended")
	q.fail.Store(true)
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "lost"}, &e); code != http.StatusInternalServerError {
		t.Fatalf("prompt with the queue down: HTTP %d %+v", code, e)
	}
	if st := r.Status(t, in.ID); st.Status != "completed" {
		t.Fatalf("after the failed resumption: %+v", st)
	}
	q.fail.Store(false)
	r.prompt(t, in.ID, "second")
	r.WaitLog(t, in.ID, "Working on: second")
	if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
		t.Fatalf("after the resumption: %+v", st)
	}
	if runnertest.HasLog(r.Logs(t, in.ID), "Working on: lost") {
		t.Error("the prompt that failed was run")
	}
}

// TestResumeDoesNotRepublishHistory: the updates an agent replays after
// session/load are the session's history; they are neither logged nor
// published again, whether the agent replays them before it answers (as
// the ACP asks) or after (as Gemini CLI does: every update between the
// answer and the next prompt is history).
func TestResumeDoesNotRepublishHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	for _, agentType := range []string{"acp-normal", "acp-late-replay"} {
		t.Run(agentType, func(t *testing.T) {
			t.Parallel()
			r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "300ms"})
			in := r.Launch(t, agentType, r.workspace(t), map[string]string{"TASK_DESCRIPTION": "first"})
			r.WaitLog(t, in.ID, "launch 1 ended")
			r.prompt(t, in.ID, "second")
			r.WaitLog(t, in.ID, "launch 2 ended")
			lines := r.Logs(t, in.ID)
			if !runnertest.HasLog(lines, "acp-agent: loaded session") || !runnertest.HasLog(lines, "Working on: second") {
				t.Fatalf("the second turn did not run on a loaded session: %+v", lines)
			}
			for _, replayed := range []string{"replayed history", "an earlier prompt"} {
				if runnertest.HasLog(lines, replayed) {
					t.Errorf("a replayed update (%q) was logged: %+v", replayed, lines)
				}
			}
			if st := r.Status(t, in.ID); st.Status != "completed" {
				t.Errorf("status %+v", st)
			}
			// Events go out in order: a replayed one would come before the
			// second turn's first.
			for _, e := range waitUpdateEvents(t, r, in.ID, "content", "Working on: second") {
				if strings.Contains(e.Update, "replayed history") || strings.Contains(e.Update, "an earlier prompt") {
					t.Errorf("a replayed update was published: %+v", e)
				}
			}
		})
	}
}

// TestOneshot runs the bridge's example tool agents (the ADK bridge's
// hybrid protocol) as oneshot agent types: a process per prompt, the prompt's JSON
// as their parameters, their one JSON object as the turn's result.
func TestOneshot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	t.Run("answers", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "oneshot-labels", r.workspace(t), map[string]string{"TASK_DESCRIPTION": `{"repo_name": "acme/docs", "issue_number": 4}`})
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" || st.ContainerID != "oneshot" {
			t.Fatalf("first prompt: %+v; logs %+v", st, r.Logs(t, in.ID))
		}
		r.WaitLog(t, in.ID, `"documentation"`)
		r.prompt(t, in.ID, `{"repo_name": "acme/tools", "issue_number": 3}`)
		r.WaitLog(t, in.ID, `"enhancement"`)
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
			t.Fatalf("second prompt: %+v", st)
		}
	})
	t.Run("hybrid protocol validation before the run", func(t *testing.T) {
		t.Parallel()
		// The agent would answer this repo_name with labels ("triage"); the
		// runner refuses it first, as the bridge does, so the agent never runs.
		in := r.Launch(t, "oneshot-labels", r.workspace(t), map[string]string{"TASK_DESCRIPTION": `{"repo_name": "acme/docs; rm -rf ~", "issue_number": 4}`})
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "failed" {
			t.Fatalf("status %+v; logs %+v", st, r.Logs(t, in.ID))
		}
		r.WaitLog(t, in.ID, "Validation error: Invalid repo_name format")
		if runnertest.HasLog(r.Logs(t, in.ID), "triage") {
			t.Error("the agent ran on parameters that fail validation")
		}
	})
	t.Run("agent-side error", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "oneshot-fails", r.workspace(t), map[string]string{"TASK_DESCRIPTION": `{"reason": "boom"}`})
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "failed" {
			t.Fatalf("status %+v", st)
		}
		r.WaitLog(t, in.ID, "giving up: boom")
		r.WaitLog(t, in.ID, "Unexpected error: boom")
	})
	t.Run("cancel kills the run", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "oneshot-slow", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "wait"})
		r.WaitLog(t, in.ID, "sleeping")
		r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "enough"}, nil)
		if st := r.WaitStatus(t, in.ID, "stopped", "failed", "completed"); st.Status != "stopped" {
			t.Fatalf("after cancel: %+v; logs %+v", st, r.Logs(t, in.ID))
		}
	})
}

// TestStrandedPrompt: a prompt stored for an instance with no launch to
// run it (it came as the agent went away, and its resumption failed) is not
// left pending for ever: the next prompt resumes it, and a cancel ends it.
func TestStrandedPrompt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, q := sharedState(t, nil)
	r, _ := runOn(t, cfg, st, q, nil)
	ctx := context.Background()
	stranded := func(id, message string) {
		in := &records.Instance{ID: id, TaskID: "task-" + id, AgentType: "acp-normal", Status: records.StatusCompleted,
			StartedAt: time.Now().UTC(), Workspace: r.workspace(t), Turn: 2, TurnDone: 1, Prompt: message, LaunchSeq: 1, DoneSeq: 1}
		if err := records.New(st).CreateInstance(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	stranded("stranded-resumed", "left behind")
	var e errorBody
	if code := r.Do(t, "POST", "/api/v1/agents/stranded-resumed/prompt", map[string]string{"message": "newer"}, &e); code != http.StatusBadRequest {
		t.Fatalf("a prompt while one is stranded: HTTP %d %+v", code, e)
	}
	r.WaitLog(t, "stranded-resumed", "Working on: left behind")
	if st := r.WaitStatus(t, "stranded-resumed", "completed", "failed", "stopped"); st.Status != "completed" {
		t.Fatalf("the stranded prompt's turn: %+v", st)
	}

	stranded("stranded-cancelled", "never")
	var c struct{ Status string }
	if code := r.Do(t, "POST", "/api/v1/agents/stranded-cancelled/cancel", map[string]string{"reason": "no"}, &c); code != http.StatusOK || c.Status != "stopped" {
		t.Fatalf("cancel of a stranded prompt: HTTP %d %+v", code, c)
	}
	stored, err := records.New(st).Instance(ctx, "stranded-cancelled")
	if err != nil {
		t.Fatal(err)
	}
	if stored.PendingTurn() || stored.Launching() {
		t.Fatalf("after the cancel: turn %d done %d, launch %d done %d", stored.Turn, stored.TurnDone, stored.LaunchSeq, stored.DoneSeq)
	}
	r.prompt(t, "stranded-cancelled", "after")
	r.WaitLog(t, "stranded-cancelled", "Working on: after")
	if runnertest.HasLog(r.Logs(t, "stranded-cancelled"), "Working on: never") {
		t.Error("the cancelled prompt ran")
	}
}
