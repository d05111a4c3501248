package service_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// runnerProcess starts cmd/runner on dataDir and returns a client of it.
func runnerProcess(t *testing.T, dataDir, root, types, port string, workers int) (*exec.Cmd, *testRunner) {
	t.Helper()
	return runnerProcessWith(t, dataDir, root, types, port, workers, nil, nil)
}

// runnerProcessWith is runnerProcess with more environment, and stderr
// copied to stderr too (when not nil).
func runnerProcessWith(t *testing.T, dataDir, root, types, port string, workers int, env []string, stderr io.Writer) (*exec.Cmd, *testRunner) {
	t.Helper()
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
		cmd.Stderr = io.MultiWriter(stderr, tWriter{t})
	case stderr != nil:
		cmd.Stderr = stderr
	case testing.Verbose():
		cmd.Stderr = tWriter{t}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := &testRunner{base: "http://127.0.0.1:" + port, root: root}
	for {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
			return cmd, r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
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
	if testing.Short() {
		t.Skip("runs the runner as a process")
	}
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(dir, "workspaces")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	types := agentTypes(t)
	port := freePort(t)
	first, r := runnerProcess(t, filepath.Join(dir, "data"), root, types, port, 1)
	running := r.launch(t, "kandev-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "long"})
	r.waitLog(t, running.ID, "tool_call file_edit")
	queued := r.launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "queued"})
	if st := r.status(t, queued.ID); st.Status != "starting" {
		t.Fatalf("the second launch should wait for the only worker: %+v", st)
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()

	_, r = runnerProcess(t, filepath.Join(dir, "data"), root, types, port, 2)
	if done := r.waitStatus(t, queued.ID, "completed", "failed"); done.Status != "completed" {
		t.Fatalf("the queued launch: %+v", done)
	}
	for countLogs(r.logs(t, running.ID), "tool_call file_edit") < 2 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := countLogs(r.logs(t, running.ID), "started kandev-slow-tool"); n != 2 {
		t.Errorf("the crashed worker's launch started %d times, want 2", n)
	}
	r.do(t, "POST", "/api/v1/agents/"+running.ID+"/cancel", map[string]string{"reason": "done"}, nil)
	if st := r.waitStatus(t, running.ID, "stopped", "failed", "completed"); st.Status != "stopped" {
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
	in := first.launch(t, "acp-slow-tool", first.workspace(t), map[string]string{"TASK_DESCRIPTION": "long"})
	first.waitLog(t, in.ID, "tool_call write notes.txt")
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
	second.waitLog(t, in.ID, "the launch will be retried")
	for countLogs(second.logs(t, in.ID), "tool_call write notes.txt") < 2 {
		time.Sleep(50 * time.Millisecond)
	}
	if st := second.status(t, in.ID); st.Status != "running" {
		t.Errorf("after the restart: %+v", st)
	}
}
