package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// ServingGRPCAddr reads a deployable's JSON log line and returns the gRPC
// address it announces in its "serving" entry (pkg/server logs one once its
// listeners are bound), or "" for any other line. Tests that start a
// deployable on port 0 learn its real address this way, so that no other
// process can take a port picked in advance.
func ServingGRPCAddr(line []byte) string {
	grpcAddr, _, _ := ServingAddrs(line)
	return grpcAddr
}

// ServingAddrs reads a deployable's JSON log line and, when it is the
// "serving" entry, returns the gRPC and HTTP addresses it announces (either
// may be "": a deployable without that listener) and true.
func ServingAddrs(line []byte) (grpcAddr, httpAddr string, ok bool) {
	var entry struct {
		Msg      string `json:"msg"`
		GRPCAddr string `json:"grpc_addr"`
		HTTPAddr string `json:"http_addr"`
	}
	if json.Unmarshal(line, &entry) != nil || entry.Msg != "serving" {
		return "", "", false
	}
	return entry.GRPCAddr, entry.HTTPAddr, true
}

// Deployable is one of Conclave's deployables (services/*/cmd/*) running
// as its own process, started by StartDeployable.
type Deployable struct {
	// Name is what it is, for messages.
	Name string
	// GRPCAddr and HTTPAddr are where it listens, as its "serving" log
	// line says ("" for a listener it does not have).
	GRPCAddr, HTTPAddr string

	cmd  *exec.Cmd
	log  *LockedBuffer
	done chan struct{}
	err  error
}

// StartDeployable runs bin with env added to this process's environment,
// and waits until it logs its "serving" line (pkg/server logs it once every
// listener is bound; the deployable must log JSON, the default), it exits,
// or ctx ends. Give it port 0 for every listener: the serving line says
// which ports it got. Its output is kept for Log.
func StartDeployable(ctx context.Context, name, bin string, env ...string) (*Deployable, error) {
	d := &Deployable{Name: name, log: &LockedBuffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin)
	d.cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	out := io.MultiWriter(d.log, pw)
	d.cmd.Stdout, d.cmd.Stderr = out, out
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start %s: %w", name, err)
	}
	serving := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if g, h, ok := ServingAddrs(sc.Bytes()); ok {
				serving <- [2]string{g, h}
				break
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		d.err = d.cmd.Wait()
		_ = pw.Close()
		close(d.done)
	}()
	select {
	case addrs := <-serving:
		d.GRPCAddr, d.HTTPAddr = addrs[0], addrs[1]
		return d, nil
	case <-d.done:
		return nil, fmt.Errorf("testenv: %s exited (%v) before serving:\n%s", name, d.err, d.log)
	case <-ctx.Done():
		d.Kill()
		return nil, fmt.Errorf("testenv: %s is not serving: %w\n%s", name, ctx.Err(), d.log)
	}
}

// Log is what the process has written so far, on stdout and stderr.
func (d *Deployable) Log() string { return d.log.String() }

// Stop asks the process to stop (SIGTERM), kills it if it has not exited
// within 30 seconds, and returns how it ended.
func (d *Deployable) Stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.Kill()
	}
	return d.err
}

// Kill ends the process with SIGKILL and waits for it.
func (d *Deployable) Kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}
