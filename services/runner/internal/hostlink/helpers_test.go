package hostlink

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// agentHostBin and acpAgentBin are cmd/agent-host and examples/acp-agent,
// built once.
var agentHostBin, acpAgentBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, remove, err := testenv.GoBuildTemp(context.Background(), "hostlink-test-", "./services/runner/cmd/agent-host", "./examples/acp-agent")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentHostBin, acpAgentBin = filepath.Join(dir, "agent-host"), filepath.Join(dir, "acp-agent")
	code := m.Run()
	remove()
	os.Exit(code)
}

// hubRig is a Hub served by a real gRPC server on 127.0.0.1.
type hubRig struct {
	hub  *Hub
	srv  *grpc.Server
	addr string
	done chan struct{}
}

var testKey = []byte("the runner's key, for tests")

// startHub serves a new hub on addr ("" for any port).
func startHub(t *testing.T, addr string, opts ...grpc.ServerOption) *hubRig {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &hubRig{hub: NewHub(testKey, slog.New(slog.DiscardHandler)), srv: grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(MaxMessageBytes))...), addr: lis.Addr().String(), done: make(chan struct{})}
	r.hub.Register(r.srv)
	go func() {
		defer close(r.done)
		_ = r.srv.Serve(lis)
	}()
	t.Cleanup(r.stop)
	return r
}

// stop is a graceful runner stop: the hub ends its streams, the server
// drains.
func (r *hubRig) stop() {
	r.hub.Shutdown()
	r.srv.GracefulStop()
	<-r.done
}

// recorder keeps what a link delivers, and says when it changes.
type recorder struct {
	mu      sync.Mutex
	updates []acp.Update
	logs    []string
	changed chan struct{}
	// onUpdate, if set, runs on each update before it is recorded.
	onUpdate func(u acp.Update)
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) options() LinkOptions {
	return LinkOptions{
		OnUpdate: func(_ context.Context, u acp.Update) {
			if r.onUpdate != nil {
				r.onUpdate(u)
			}
			r.mu.Lock()
			r.updates = append(r.updates, u)
			r.signal()
			r.mu.Unlock()
		},
		OnLog: func(stream, text string) {
			r.mu.Lock()
			r.logs = append(r.logs, stream+": "+text)
			r.signal()
			r.mu.Unlock()
		},
	}
}

func (r *recorder) signal() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// waitFor waits until cond holds of what was recorded, woken by each
// change rather than polling, and fails the test after a minute.
func (r *recorder) waitFor(t *testing.T, what string, cond func(updates []acp.Update, logs []string) bool) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok, ch := cond(r.updates, r.logs), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			r.mu.Lock()
			n, logs := len(r.updates), r.logs
			r.mu.Unlock()
			t.Fatalf("waiting for %s: still not after a minute; %d updates, the logs %q", what, n, logs)
		}
	}
}

func (r *recorder) texts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, u := range r.updates {
		out = append(out, u.Kind+": "+u.Text)
	}
	return out
}

func (r *recorder) allLogs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.logs...)
}

func hasUpdate(text string) func([]acp.Update, []string) bool {
	return func(us []acp.Update, _ []string) bool {
		for _, u := range us {
			if u.Text == text {
				return true
			}
		}
		return false
	}
}

// hostProc is agent-host running as a subprocess.
type hostProc struct {
	cmd    *exec.Cmd
	stderr *testenv.LockedBuffer
	done   chan struct{}
	code   int
}

// hostSpec is one agent-host to start.
type hostSpec struct {
	addr, instance, token, workspace string
	launch                           int64
	env                              map[string]string
	agent                            []string
}

func startHost(t *testing.T, s hostSpec) *hostProc {
	t.Helper()
	if s.launch == 0 {
		s.launch = 1
	}
	if s.token == "" {
		s.token = Token(testKey, s.instance)
	}
	cmd := exec.Command(agentHostBin, append([]string{"--"}, s.agent...)...)
	cmd.Dir = s.workspace
	env := map[string]string{
		"CONCLAVE_AGENT_HOST_RUNNER_ADDR":   s.addr,
		"CONCLAVE_AGENT_HOST_TOKEN":         s.token,
		"CONCLAVE_AGENT_HOST_INSTANCE_ID":   s.instance,
		"CONCLAVE_AGENT_HOST_LAUNCH":        fmt.Sprint(s.launch),
		"CONCLAVE_AGENT_HOST_WORKSPACE":     s.workspace,
		"CONCLAVE_AGENT_HOST_PERMISSION":    "allow",
		"CONCLAVE_AGENT_HOST_BACKOFF_MIN":   "20ms",
		"CONCLAVE_AGENT_HOST_BACKOFF_MAX":   "200ms",
		"CONCLAVE_AGENT_HOST_HEARTBEAT":     "1s",
		"CONCLAVE_AGENT_HOST_KILL_GRACE":    "5s",
		"CONCLAVE_LOG_FORMAT":               "text",
		"PATH":                              os.Getenv("PATH"),
		"HOME":                              os.TempDir(),
		"SOMETHING_THE_AGENT_SHOULD_SEE":    "yes",
		"CONCLAVE_AGENT_HOST_NOT_A_SETTING": "still hidden",
	}
	for k, v := range s.env {
		env[k] = v
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &hostProc{cmd: cmd, stderr: &testenv.LockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = io.Discard, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() {
			t.Logf("agent-host's stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// launchHost has rig's hub expect the first launch of s.instance, with a
// new recorder, and starts its agent-host on rig's address.
func launchHost(t *testing.T, rig *hubRig, s hostSpec) (*recorder, *Link, *hostProc) {
	t.Helper()
	rec := newRecorder()
	link := rig.hub.Expect(s.instance, 1, rec.options())
	s.addr = rig.addr
	return rec, link, startHost(t, s)
}

// wait returns agent-host's exit code once it has exited, within a minute.
func (p *hostProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(time.Minute):
		t.Fatalf("agent-host (pid %d) has not exited within a minute", p.cmd.Process.Pid)
		return 0
	}
}

// closeAndExit closes link, which ends its agent, and checks that
// agent-host then exits 0.
func closeAndExit(t *testing.T, link *Link, p *hostProc) {
	t.Helper()
	_ = link.Close()
	if code := p.wait(t); code != 0 {
		t.Fatalf("agent-host exited %d", code)
	}
}

// awaitDone waits a minute at most for link, named what, to be done.
func awaitDone(t *testing.T, link *Link, what string) {
	t.Helper()
	select {
	case <-link.Done():
	case <-time.After(time.Minute):
		t.Fatalf("%s is not done within a minute", what)
	}
}

// fileExists reports whether dir/name exists.
func fileExists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// chunks are the texts "chunk 1" .. "chunk n".
func chunks(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("content: chunk %d", i+1)
	}
	return out
}

// onlyChunks keeps the chunk texts of texts.
func onlyChunks(texts []string) []string {
	var out []string
	for _, s := range texts {
		if strings.HasPrefix(s, "content: chunk ") {
			out = append(out, s)
		}
	}
	return out
}

// grpcWindows fixes the server's flow-control windows at their minimum,
// which turns off their growth.
func grpcWindows() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(64 << 10), grpc.InitialConnWindowSize(64 << 10)}
}

// proxy is a TCP proxy whose connections a test can drop.
type proxy struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
	count int
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: lis.Addr().String()}
	t.Cleanup(func() { lis.Close(); p.dropAll() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.count++
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close(); c.Close() }()
			go func() { _, _ = io.Copy(c, up); up.Close(); c.Close() }()
		}
	}()
	return p
}

// dropAll closes every connection through the proxy.
func (p *proxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}
