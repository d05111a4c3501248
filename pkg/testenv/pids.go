package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Exited reports whether the process pid has exited: it is gone from
// /proc, or a zombie not yet reaped. Linux only.
func Exited(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command's name, which may hold spaces and
	// parentheses: it is the field after the last ')'.
	i := strings.LastIndexByte(string(st), ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(string(st[i+1:])), "Z")
}

// WaitExited waits a minute at most for the process pid, what, to exit.
func WaitExited(t testing.TB, pid int, what string) {
	t.Helper()
	Eventually(t, time.Minute, fmt.Sprintf("%s (pid %d) to exit", what, pid), func() bool { return Exited(pid) })
}

// ReadPIDFile waits a minute at most for a positive pid in the file at
// path, which a process under test writes, and returns it.
func ReadPIDFile(t testing.TB, path string) int {
	t.Helper()
	var pid int
	EventuallyNoError(t, time.Minute, "a pid in "+path, func() error {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if pid, err = strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid <= 0 {
			err = fmt.Errorf("pid %d", pid)
		}
		return err
	})
	return pid
}
