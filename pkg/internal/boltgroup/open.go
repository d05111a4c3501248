package boltgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// lockWait is how long Open waits for another process to let go of a file.
const lockWait = 5 * time.Second

// Open opens or creates the bbolt file at path. bbolt locks the file for
// one process; when another holds it, Open waits lockWait, then fails
// saying so, and naming that process when the system tells (Linux's
// /proc/locks), rather than with bbolt's bare "timeout".
func Open(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockWait})
	if errors.Is(err, berrors.ErrTimeout) {
		holder := "another process"
		switch pid, cmd := lockHolder(path); {
		case pid == os.Getpid():
			holder = "this process itself (it opened the file before)"
		case pid != 0:
			holder = fmt.Sprintf("process %d (%s)", pid, cmd)
		}
		return nil, fmt.Errorf("%s holds %s (waited %s): stop it, or give this one another data directory (CONCLAVE_DATA_DIR): %w", holder, path, lockWait, err)
	}
	return db, err
}

// lockHolder finds the process holding a lock on path in /proc/locks, and
// its command line; 0 when it cannot be known.
func lockHolder(path string) (pid int, cmd string) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, ""
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0, ""
	}
	defer f.Close()
	// "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF": the pid, then
	// major:minor:inode of the locked file.
	want := ":" + strconv.FormatUint(st.Ino, 10)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || !strings.HasSuffix(fields[5], want) {
			continue
		}
		if p, err := strconv.Atoi(fields[4]); err == nil {
			return p, commandLine(p)
		}
	}
	return 0, ""
}

// commandLine is process pid's command line, arguments joined by spaces,
// at most 200 bytes; "" when it cannot be read.
func commandLine(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
