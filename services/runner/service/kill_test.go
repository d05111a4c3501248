package service_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// processState is what a runner process runs on, and the next process
// started on it takes over: a data directory, a workspace root, the agent
// types and the HTTP port.
type processState struct{ data, root, types, port string }

// newProcessState opens a test that runs the runner as a process: skipped
// under -short, run in parallel with the other tests.
func newProcessState(t *testing.T) processState {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the runner as a process")
	}
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(dir, "workspaces")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return processState{data: filepath.Join(dir, "data"), root: root, types: agentTypes(t), port: freePort(t)}
}

// start starts cmd/runner on s and returns a client of it.
func (s processState) start(t *testing.T, workers int) (*exec.Cmd, *testRunner) {
	t.Helper()
	return s.startWith(t, workers, nil, nil)
}

// startWith is start with more environment, and stderr copied to stderr
// too (when not nil).
func (s processState) startWith(t *testing.T, workers int, env []string, stderr io.Writer) (*exec.Cmd, *testRunner) {
	t.Helper()
	dataDir, root, types, port := s.data, s.root, s.types, s.port
	cmd := exec.Command(runnerBin)
	cmd.Env = append(os.Environ(),
		"CONCLAVE_DATA_DIR="+dataDir, "CONCLAVE_BACKEND=embedded",
		"CONCLAVE_RUNNER_HTTP_ADDR=127.0.0.1:"+port, "CONCLAVE_RUNNER_GRPC_ADDR=127.0.0.1:0",
		"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED=true", "CONCLAVE_RUNNER_WORKSPACE_ROOTS="+root,
		"CONCLAVE_RUNNER_AGENT_TYPES="+types, "CONCLAVE_RUNNER_LAUNCH_RETRY=2s",
		fmt.Sprintf("CONCLAVE_RUNNER_WORKERS=%d", workers), "CONCLAVE_RUNNER_SERVER_ID=killed",
		"CONCLAVE_RUNNER_CLIENT_RATE=1000000", "CONCLAVE_RUNNER_CLIENT_BURST=1000000",
	)
	cmd.Env = append(cmd.Env, env...)
	switch {
	case stderr != nil && testing.Verbose():
		cmd.Stderr = io.MultiWriter(stderr, runnertest.TWriter{T: t})
	case stderr != nil:
		cmd.Stderr = stderr
	case testing.Verbose():
		cmd.Stderr = runnertest.TWriter{T: t}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := &testRunner{API: &runnertest.API{Base: "http://127.0.0.1:" + port}, root: root}
	testenv.EventuallyNoError(t, time.Minute, "the runner to listen on "+port, func() error {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
		}
		return err
	})
	return cmd, r
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(testenv.As[*net.TCPAddr](t, l.Addr(), "the listener's address").Port)
}

// killRunner ends a runner process with SIGKILL, as a crash would, and waits
// for it to have exited.
func killRunner(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatalf("the runner process %d has not exited a minute after SIGKILL", cmd.Process.Pid)
	}
}

func countLogs(lines []logLine, want string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l.Text, want) {
			n++
		}
	}
	return n
}

// TestKilledRunner kills the runner process (SIGKILL) with one launch
// running and one still in the queue behind it. The next runner on the same
// state runs both: the queued one, and the crashed worker's one again.
func TestKilledRunner(t *testing.T) {
	ps := newProcessState(t)
	first, r := ps.start(t, 1)
	running := r.Launch(t, "kandev-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "long"})
	r.WaitLog(t, running.ID, "tool_call file_edit")
	queued := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "queued"})
	if st := r.Status(t, queued.ID); st.Status != "starting" {
		t.Fatalf("the second launch should wait for the only worker: %+v", st)
	}
	killRunner(t, first)

	_, r = ps.start(t, 2)
	if done := r.WaitStatus(t, queued.ID, "completed", "failed"); done.Status != "completed" {
		t.Fatalf("the queued launch: %+v", done)
	}
	r.waitLogCount(t, running.ID, "tool_call file_edit", 2)
	if n := countLogs(r.Logs(t, running.ID), "started kandev-slow-tool"); n != 2 {
		t.Errorf("the crashed worker's launch started %d times, want 2", n)
	}
	if st := r.cancelToEnd(t, running.ID, "done"); st.Status != "stopped" {
		t.Errorf("after cancel: %+v", st)
	}
}

// TestGracefulRestart stops a runner (as on SIGTERM) while an agent works:
// the agent is stopped, its launch left on the queue, and the next runner
// on the same store and queue runs it again.
func TestGracefulRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, q := sharedState(t, nil)

	first, stop := runOn(t, cfg, st, q, nil)
	in := first.Launch(t, "acp-slow-tool", first.workspace(t), map[string]string{"TASK_DESCRIPTION": "long"})
	first.WaitLog(t, in.ID, "tool_call write notes.txt")
	if err := stop(); err != nil {
		t.Fatalf("the first runner's Run: %v", err)
	}
	// Nothing terminal was recorded for a launch that is to be retried.
	stored, err := records.New(st).Instance(context.Background(), in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Terminal() || !stored.Launching() || !stored.PendingTurn() {
		t.Fatalf("stored after the shutdown: status %s, launch %d done %d, turn %d done %d", stored.Status, stored.LaunchSeq, stored.DoneSeq, stored.Turn, stored.TurnDone)
	}

	second, _ := runOn(t, cfg, st, q, nil)
	second.WaitLog(t, in.ID, "the launch will be retried")
	second.waitLogCount(t, in.ID, "tool_call write notes.txt", 2)
	if st := second.Status(t, in.ID); st.Status != "running" {
		t.Errorf("after the restart: %+v", st)
	}
}

// TestAgentsDieWithTheRunner kills the runner process (SIGKILL) while it
// holds an agent that would outlive its stdin: the agent dies with it (its
// death signal), so no copy of it runs beside the next runner's. What the
// agent started in its process group outlives both (the death signal is
// the agent's own): the next runner on the same data directory ends it
// before it serves or runs anything. A runner stopped gracefully ends its
// agents' groups itself.
func TestAgentsDieWithTheRunner(t *testing.T) {
	ps := newProcessState(t)
	first, r := ps.start(t, 1)
	ws := r.workspace(t)
	in := r.Launch(t, "acp-lingering-group", ws, map[string]string{"TASK_DESCRIPTION": "first"})
	if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
		t.Fatalf("the first turn: %+v", st)
	}
	agent, err := strconv.Atoi(r.Status(t, in.ID).ContainerID)
	if err != nil {
		t.Fatalf("the agent's pid: %v", err)
	}
	child := testenv.ReadPIDFile(t, filepath.Join(ws, "child.pid"))
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	os.Remove(filepath.Join(ws, "child.pid"))

	killRunner(t, first)
	testenv.WaitExited(t, agent, "the agent of the killed runner")
	if testenv.Exited(child) {
		t.Fatal("the agent's child died with the runner: this test no longer shows the restart's cleanup")
	}

	second, r := ps.start(t, 1)
	// Ended before the runner listened; SIGKILL's exit may still be under
	// way.
	testenv.WaitExited(t, child, "the child the killed runner's agent left")
	// The launch is taken over (nothing to run: its turn had ended), and
	// the next prompt resumes the session in a new process.
	r.WaitLog(t, in.ID, "delivered again with no prompt pending")
	r.prompt(t, in.ID, "again")
	r.waitLogCount(t, in.ID, "started acp-lingering-group", 2)
	child = testenv.ReadPIDFile(t, filepath.Join(ws, "child.pid"))
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = second.Wait()
	testenv.WaitExited(t, child, "the child of a gracefully stopped runner's agent")
}
