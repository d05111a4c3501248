package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
)

// Dev is a running `conclave dev`, started by StartDev as a user starts it,
// every service on a free loopback port.
type Dev struct {
	// Cmd is the process, for signals; Wait, Stop and Kill end it.
	Cmd *exec.Cmd
	process

	addrs map[string]string
}

// DevPortFlags are the flags that put every service of `conclave dev` on a
// free loopback port. StartDev passes them before the caller's arguments,
// which may override any of them (the last of a repeated flag wins).
var DevPortFlags = []string{
	"--gateway-grpc-addr=127.0.0.1:0", "--gateway-http-addr=127.0.0.1:0",
	"--librarian-http-addr=127.0.0.1:0", "--bridge-http-addr=127.0.0.1:0",
	"--bus-addr=127.0.0.1:0", "--runner-grpc-addr=127.0.0.1:0",
	"--runner-http-addr=127.0.0.1:0", "--console-http-addr=127.0.0.1:0",
}

// devRow is a row of the endpoint table conclave dev prints on stdout:
// SERVICE, ADDRESS, SERVES.
var devRow = regexp.MustCompile(`^(\w+)\s+(\S+)\s+([\w-]+)`)

// DevTableRow reads a line of conclave dev's endpoint table (or of a copy
// of it, such as the README's): its row's name as Addr takes it ("gateway
// gRPC") and its address; ok is false for the header and other lines.
func DevTableRow(line string) (row, addr string, ok bool) {
	m := devRow.FindStringSubmatch(line)
	if m == nil || m[1] == "SERVICE" {
		return "", "", false
	}
	return m[1] + " " + m[3], m[2], true
}

// StartDev runs `bin dev` with DevPortFlags and args in dir (the process's
// working directory, "" for this one's), with env added to this process's
// environment, and returns once it has printed its endpoint table (the
// table ends with an empty line), it exits, or ctx ends. Its standard error,
// the services' logs, is kept for Log.
func StartDev(ctx context.Context, bin, dir string, args, env []string) (*Dev, error) {
	cmd := exec.Command(bin, append(append([]string{"dev"}, DevPortFlags...), args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	d := &Dev{Cmd: cmd, process: newProcess(cmd), addrs: map[string]string{}}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = d.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start conclave dev: %w", err)
	}
	table := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		complete := false
		for sc.Scan() {
			if sc.Text() == "" {
				complete = true
				break
			}
			if row, addr, ok := DevTableRow(sc.Text()); ok {
				d.addrs[row] = addr
			}
		}
		table <- complete
		_, _ = io.Copy(io.Discard, stdout)
		d.finish(nil)
	}()
	select {
	case complete := <-table:
		if complete {
			return d, nil
		}
		<-d.done
		return nil, fmt.Errorf("testenv: conclave dev exited (%v) before printing its endpoint table:\n%s", d.err, d.log)
	case <-ctx.Done():
		d.Kill()
		return nil, fmt.Errorf("testenv: conclave dev printed no endpoint table: %w\n%s", ctx.Err(), d.log)
	}
}

// Addr is the address of a row of the endpoint table, named by its service
// and protocol ("gateway gRPC", "bus WebSocket", "runner HTTP", ...), or ""
// when the table has no such row.
func (d *Dev) Addr(row string) string { return d.addrs[row] }

// Addrs is the whole endpoint table, by Addr's names.
func (d *Dev) Addrs() map[string]string { return d.addrs }
