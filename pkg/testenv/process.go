package testenv

import (
	"os/exec"
	"syscall"
	"time"
)

// process is a child process of a test whose output is kept: the common
// part of Dev and Deployable.
type process struct {
	cmd  *exec.Cmd
	log  *LockedBuffer
	done chan struct{}
	err  error
}

func newProcess(cmd *exec.Cmd) process {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return process{cmd: cmd, log: &LockedBuffer{}, done: make(chan struct{})}
}

// finish waits for the process to exit, runs then (when not nil), and
// marks it done; its one caller is the goroutine that owns the process's
// output.
func (p *process) finish(then func()) {
	p.err = p.cmd.Wait()
	if then != nil {
		then()
	}
	close(p.done)
}

// Log is what the process has written so far (what of its output is kept).
func (p *process) Log() string { return p.log.String() }

// LogBuffer is the buffer Log reads, for a caller that formats it later.
func (p *process) LogBuffer() *LockedBuffer { return p.log }

// Wait waits for the process to exit and returns how it ended.
func (p *process) Wait() error {
	<-p.done
	return p.err
}

// Stop asks the process to stop (SIGTERM, which lets a deployable drain and
// the runner stop its agents), kills it if it has not exited within 30
// seconds, and returns how it ended.
func (p *process) Stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.Kill()
	}
	return p.err
}

// Kill ends the process with SIGKILL and waits for it.
func (p *process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}
