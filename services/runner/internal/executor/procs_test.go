package executor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

// startGroup starts sh -c script in a process group of its own, as the
// local executor starts an agent, and returns it, with its start time.
func startGroup(t *testing.T, dir, script string) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	st, err := readProcStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, st.start
}

// writeRecords writes a records file as a runner that has died left it:
// unlocked.
func writeRecords(t *testing.T, dir, name string, entries map[int]uint64) string {
	t.Helper()
	var b strings.Builder
	for pid, start := range entries {
		fmt.Fprintf(&b, "%d %d\n", pid, start)
	}
	path := filepath.Join(dir, name+recordSuffix)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A runner started on a directory ends the process groups an earlier
// runner recorded there and left running (its lock free), whether their
// leader still runs or only what it started; it leaves a process whose pid
// was reused (another start time), and what a live runner (its lock held)
// records.
func TestEndLeftovers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	work := t.TempDir()

	leader, leaderStart := startGroup(t, work, "sleep 300 & echo $! > leader-child.pid; wait")
	leaderChild := testenv.ReadPIDFile(t, filepath.Join(work, "leader-child.pid"))

	// A group whose leader is gone (killed by its death signal) and whose
	// child lives on.
	orphaned, orphanedStart := startGroup(t, work, "sleep 300 </dev/null >/dev/null 2>&1 & echo $! > orphan.pid")
	_ = orphaned.Wait()
	orphan := testenv.ReadPIDFile(t, filepath.Join(work, "orphan.pid"))

	reused, reusedStart := startGroup(t, work, "exec sleep 300")
	held, heldStart := startGroup(t, work, "exec sleep 300")

	writeRecords(t, dir, "runner-dead", map[int]uint64{
		leader.Process.Pid:   leaderStart,
		orphaned.Process.Pid: orphanedStart,
		reused.Process.Pid:   reusedStart + 1,
	})
	live := writeRecords(t, dir, "runner-live", map[int]uint64{held.Process.Pid: heldStart})
	lock, err := os.Open(live)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	recs, err := OpenProcessRecords(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer recs.Close()
	// Ended before OpenProcessRecords returned: no waiting on a kill.
	for what, pid := range map[string]int{"the recorded leader's child": leaderChild, "the orphaned child": orphan} {
		if !testenv.Exited(pid) {
			// SIGKILL is delivered at once, but the exit may still be
			// under way on a busy machine.
			testenv.WaitExited(t, pid, what)
		}
	}
	_ = leader.Wait()
	if testenv.Exited(reused.Process.Pid) {
		t.Error("a process whose pid matched but whose start time did not was killed")
	}
	if testenv.Exited(held.Process.Pid) {
		t.Error("a live runner's agent was killed")
	}
	if _, err := os.Stat(filepath.Join(dir, "runner-dead"+recordSuffix)); !os.IsNotExist(err) {
		t.Errorf("the dead runner's records are still there: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live runner's records: %v", err)
	}
}

// The local executor records each agent while it runs, and forgets it once
// its group is killed; Close removes the runner's file.
func TestLocalRecordsAgents(t *testing.T) {
	t.Parallel()
	dir, ws := t.TempDir(), t.TempDir()
	recs, err := OpenProcessRecords(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"+recordSuffix))
	if len(files) != 1 {
		t.Fatalf("records files %v, want one", files)
	}
	typ := agenttype.Type{ID: "sh", Command: []string{"sh", "-c", "exec sleep 300"}, Enabled: true}
	p, err := (&Local{Roots: []string{ws}, Records: recs}).Start(context.Background(), Spec{InstanceID: "i", Type: typ, Workspace: ws}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	st, err := readProcStat(mustAtoi(t, p.ID()))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(files[0])
	if want := fmt.Sprintf("%s %d\n", p.ID(), st.start); string(data) != want {
		t.Errorf("records %q, want %q", data, want)
	}
	_ = p.Kill()
	_ = p.Wait()
	if data, _ := os.ReadFile(files[0]); len(data) != 0 {
		t.Errorf("records after the agent ended: %q", data)
	}
	if err := recs.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(files[0]); !os.IsNotExist(err) {
		t.Errorf("the records file after Close: %v", err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The executor's last check: a launch's env that hooks the agent's shell
// (a launch stored before the API refused it) starts nothing.
func TestLocalRefusesHookEnv(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	marker := filepath.Join(ws, "hook-ran")
	hook := filepath.Join(ws, "hook.sh")
	if err := os.WriteFile(hook, []byte("touch "+marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	typ := agenttype.Type{ID: "bash", Command: []string{"/bin/bash", "-c", "true"}, LaunchEnv: []string{"B*"}, Enabled: true}
	p, err := (&Local{Roots: []string{ws}}).Start(context.Background(), Spec{InstanceID: "i", Type: typ, Workspace: ws,
		Env: map[string]string{"BASH_ENV": hook}}, io.Discard)
	if err == nil {
		_ = p.Wait()
		t.Fatal("started an agent whose launch set BASH_ENV")
	}
	if !strings.Contains(err.Error(), "BASH_ENV") {
		t.Errorf("error %q does not name BASH_ENV", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the hook ran")
	}
	// Set by the operator, in the type's own env, it is the agent's.
	typ.Env = map[string]string{"BASH_ENV": hook}
	p, err = (&Local{Roots: []string{ws}}).Start(context.Background(), Spec{InstanceID: "i", Type: typ, Workspace: ws,
		Env: map[string]string{"BASH_ENV": hook}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Wait()
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the operator's BASH_ENV did not reach the agent: %v", err)
	}
}
