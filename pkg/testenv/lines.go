package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Lines is a process's standard output, line by line, for a test that
// waits for what the process prints: every wait has a deadline, where a
// bare Scanner.Scan waits for as long as the process prints nothing.
type Lines struct {
	cmd   *exec.Cmd
	lines chan string // closed at the output's end
}

// StartLines starts cmd, whose Stdout must not be set, and ends it
// (SIGKILL) when the test ends unless Exit has.
func StartLines(t testing.TB, cmd *exec.Cmd) *Lines {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	l := &Lines{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(l.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			for range l.lines {
			}
			_ = cmd.Wait()
		}
	})
	return l
}

// Next is the next line, failing t when none comes within timeout or the
// output ends first; what names the line waited for.
func (l *Lines) Next(t testing.TB, timeout time.Duration, what string) string {
	t.Helper()
	select {
	case line, ok := <-l.lines:
		if !ok {
			t.Fatalf("%s: %s's output ended", what, l.cmd.Path)
		}
		return line
	case <-time.After(timeout):
		t.Fatalf("%s: no line from %s within %s", what, l.cmd.Path, timeout)
	}
	return ""
}

// Exit sends sig, lets the process end within timeout (failing t when it
// does not), discarding what it still prints, and returns how it ended.
func (l *Lines) Exit(t testing.TB, timeout time.Duration, sig os.Signal) error {
	t.Helper()
	if err := l.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-l.lines:
			if !ok {
				return l.cmd.Wait()
			}
		case <-deadline:
			t.Fatalf("%s still prints or runs %s after %v", l.cmd.Path, timeout, sig)
		}
	}
}
