package executor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ProcessRecords is the local executor's record of the agents one runner
// process has started and not yet seen end: a file of its own in a
// directory (cmd/runner's and conclave dev's is runner-agents under
// CONCLAVE_DATA_DIR), holding each agent's pid and start time, and locked
// (flock) for as long as the runner lives. An agent dies with its runner
// (Pdeathsig), but what it started in its process group does not, nor an
// agent whose death signal could not apply: a runner started on the same
// directory ends, before it runs anything, the process groups recorded in
// files no live runner holds.
type ProcessRecords struct {
	log *slog.Logger

	mu    sync.Mutex
	f     *os.File
	path  string         // f's name since its rename
	procs map[int]uint64 // pid (and process group) → start time
}

// recordSuffix ends every records file; a file being made has another
// name until it is locked.
const recordSuffix = ".agents"

// OpenProcessRecords ends what earlier runners recorded in dir and did
// not end (files whose lock is free: their runner is gone), then starts
// this runner's own file there.
func OpenProcessRecords(dir string, logger *slog.Logger) (*ProcessRecords, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("agent process records: %w", err)
	}
	endLeftovers(dir, logger)
	// Locked under a name the sweep above passes over, then renamed (the
	// lock stays with the open file): another runner starting now never
	// takes this file for a dead runner's.
	f, err := os.CreateTemp(dir, "starting-*")
	if err != nil {
		return nil, fmt.Errorf("agent process records: %w", err)
	}
	fail := func(err error) (*ProcessRecords, error) {
		_ = os.Remove(f.Name())
		f.Close()
		return nil, fmt.Errorf("agent process records: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fail(err)
	}
	name := filepath.Join(dir, fmt.Sprintf("runner-%d-%s%s", os.Getpid(), strings.TrimPrefix(filepath.Base(f.Name()), "starting-"), recordSuffix))
	if err := os.Rename(f.Name(), name); err != nil {
		return fail(err)
	}
	return &ProcessRecords{log: logger, f: f, path: name, procs: map[int]uint64{}}, nil
}

// add records pid, just started (and not yet waited for, so its /proc
// entry is there even if it has exited).
func (r *ProcessRecords) add(pid int) {
	st, err := readProcStat(pid)
	if err != nil {
		r.log.Warn("cannot record an agent process: a crash of this runner may leave what it starts running", "pid", pid, "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs[pid] = st.start
	r.writeLocked()
}

// remove forgets pid, whose group has been killed.
func (r *ProcessRecords) remove(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.procs[pid]; ok {
		delete(r.procs, pid)
		r.writeLocked()
	}
}

// writeLocked writes the whole record over the file, then cuts it to
// length: a crash midway leaves every entry that is still to be kept.
func (r *ProcessRecords) writeLocked() {
	if r.f == nil {
		return
	}
	var b bytes.Buffer
	for _, pid := range slices.Sorted(maps.Keys(r.procs)) {
		fmt.Fprintf(&b, "%d %d\n", pid, r.procs[pid])
	}
	_, err := r.f.WriteAt(b.Bytes(), 0)
	if err == nil {
		err = r.f.Truncate(int64(b.Len()))
	}
	if err != nil {
		r.log.Warn("cannot write the agent process records", "file", r.path, "err", err)
	}
}

// Close removes this runner's file, once its agents have ended.
func (r *ProcessRecords) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	if len(r.procs) > 0 {
		// Left for the next runner on the directory to end.
		r.writeLocked()
		err := r.f.Close()
		r.f = nil
		return err
	}
	err := os.Remove(r.path)
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	r.f = nil
	return err
}

// endLeftovers ends the process groups recorded in dir's files that no
// live runner holds, and removes those files.
func endLeftovers(dir string, logger *slog.Logger) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		logger.Warn("cannot read the agent process records", "dir", dir, "err", err)
		return
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), recordSuffix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue // removed by another runner meanwhile
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // a live runner's
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var pid int
			var start uint64
			if _, err := fmt.Sscanf(sc.Text(), "%d %d", &pid, &start); err != nil || pid <= 1 {
				continue
			}
			if n := endLeftover(pid, start); n > 0 {
				logger.Warn("ended agent processes an earlier runner left running", "process_group", pid, "processes", n, "records", path)
			}
		}
		_ = os.Remove(path)
		f.Close()
	}
}

// endLeftover kills the process group of pid, an agent started at start
// (clock ticks since boot), if it is still that agent's, and returns how
// many processes it had. A pid is not reused while a process group of
// that number exists, so a leader found with another start time means the
// agent's group is long gone; one not found, a group whose leader died
// (its death signal) and whose members live on, started since it.
func endLeftover(pid int, start uint64) int {
	if st, err := readProcStat(pid); err == nil {
		if st.start != start {
			return 0
		}
		members := len(groupMembers(pid))
		// The leader too, in case it had left its group.
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return max(members, 1)
	}
	members := groupMembers(pid)
	if len(members) == 0 {
		return 0
	}
	for _, m := range members {
		if m.start < start {
			return 0
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	return len(members)
}

// procStat is what endLeftover reads of a process.
type procStat struct {
	pid, pgrp int
	start     uint64
}

// readProcStat reads /proc/<pid>/stat: the process group (field 5) and
// the start time (field 22), after the command name, which may hold
// spaces and parentheses.
func readProcStat(pid int) (procStat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return procStat{}, errors.New("malformed /proc stat")
	}
	pgrp, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procStat{}, errors.New("malformed /proc stat")
	}
	return procStat{pid: pid, pgrp: pgrp, start: start}, nil
}

// groupMembers lists the processes in process group pgid.
func groupMembers(pgid int) []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readProcStat(pid); err == nil && st.pgrp == pgid {
			out = append(out, st)
		}
	}
	return out
}

// starter is the one OS thread every local agent is forked from. Linux
// sends an agent its death signal (Pdeathsig) when the thread that forked
// it ends, not the process (golang/go#27505), and the Go runtime ends a
// thread when a goroutine locked to it returns. This goroutine is locked
// to its thread and never returns, so the signal comes only when the
// runner dies.
var starter struct {
	once sync.Once
	reqs chan func()
}

// startOnStarterThread runs cmd.Start on the starter thread.
func startOnStarterThread(cmd interface{ Start() error }) error {
	starter.once.Do(func() {
		starter.reqs = make(chan func())
		go func() {
			runtime.LockOSThread()
			for f := range starter.reqs {
				f()
			}
		}()
	})
	done := make(chan error, 1)
	starter.reqs <- func() { done <- cmd.Start() }
	return <-done
}
