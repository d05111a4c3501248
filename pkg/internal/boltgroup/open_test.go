package boltgroup

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// holdEnv, set in a child run of this test binary, names a file the child
// locks as bbolt does, until its stdin closes.
const holdEnv = "BOLTGROUP_TEST_HOLD"

func TestMain(m *testing.M) {
	if path := os.Getenv(holdEnv); path != "" {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		}
		if err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("locked\n")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestOpenNamesTheHolder: a file another process holds is refused after
// the wait, with an error naming that process, not bbolt's bare timeout.
func TestOpenNamesTheHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 5 s for the lock")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), holdEnv+"="+path)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = child.Wait() })
	line := make([]byte, len("locked\n"))
	if _, err := io.ReadFull(stdout, line); err != nil {
		t.Fatalf("the child did not say it holds the lock: %v", err)
	}

	_, err = Open(path)
	if err == nil {
		t.Fatal("opened a file another process holds")
	}
	for _, want := range []string{"process " + strconv.Itoa(child.Process.Pid), path, "CONCLAVE_DATA_DIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
}
