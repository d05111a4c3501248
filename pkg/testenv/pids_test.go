package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestPIDs: a pid file is read once written; a running process has not
// exited, and has once it is reaped or a zombie.
func TestPIDs(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	path := filepath.Join(t.TempDir(), "x.pid")
	if err := os.WriteFile(path, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pid := ReadPIDFile(t, path)
	if pid != cmd.Process.Pid {
		t.Fatalf("ReadPIDFile = %d, want %d", pid, cmd.Process.Pid)
	}
	if Exited(pid) {
		t.Fatal("a sleeping process counts as exited")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: a zombie, which counts as exited.
	WaitExited(t, pid, "the killed sleep")
	_ = cmd.Wait()
	if !Exited(pid) {
		t.Fatal("a reaped process does not count as exited")
	}
}
