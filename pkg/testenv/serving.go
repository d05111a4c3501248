package testenv

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	process
}

// StartDeployable runs bin with env added to this process's environment,
// and waits until it logs its "serving" line (pkg/server logs it once every
// listener is bound; the deployable must log JSON, the default), it exits,
// or ctx ends. Give it port 0 for every listener: the serving line says
// which ports it got. Its output is kept for Log.
func StartDeployable(ctx context.Context, name, bin string, env ...string) (*Deployable, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	return StartCommand(ctx, name, cmd)
}

// StartCommand is StartDeployable for a command the caller made: a
// deployable run with arguments (`bub serve`, `conclave bus serve`), its
// environment set on cmd. Its output must not be set.
func StartCommand(ctx context.Context, name string, cmd *exec.Cmd) (*Deployable, error) {
	d := &Deployable{Name: name, process: newProcess(cmd)}
	pr, pw := io.Pipe()
	out := io.MultiWriter(d.log, pw)
	cmd.Stdout, cmd.Stderr = out, out
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
	go d.finish(func() { _ = pw.Close() })
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
