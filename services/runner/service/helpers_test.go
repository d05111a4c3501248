package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/service"
)

// agentBin is examples/acp-agent, built once for every test.
var agentBin string

// runnerBin is cmd/runner, for the tests that kill the process.
var runnerBin string

// repoRoot is the repository's root, for node_modules.
var repoRoot string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "runner-test-")
	if err != nil {
		panic(err)
	}
	wd, _ := os.Getwd()
	repoRoot = filepath.Join(wd, "..", "..", "..")
	agentBin = filepath.Join(dir, "acp-agent")
	runnerBin = filepath.Join(dir, "runner")
	if err := testenv.GoBuild(context.Background(), dir+string(filepath.Separator), "./examples/acp-agent", "./services/runner/cmd/runner"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// agentTypes is a registry file of the example agent in each dialect and
// mode the tests use, and the npm SDK's example agent.
func agentTypes(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("agent_types:\n")
	for _, dialect := range []string{"acp", "kandev", "legacy"} {
		for _, mode := range []string{"normal", "slow-tool", "ignore-cancel", "hang", "hang-init", "hang-init-once", "crash", "junk", "linger", "deaf", "orphan", "late-replay"} {
			protocol := dialect
			if dialect != "legacy" && mode == "normal" {
				protocol = "" // detected from initialize
			}
			fmt.Fprintf(&b, "  - id: %s-%s\n    name: example %s %s\n    command: [%q, -dialect, %s, -mode, %s]\n    protocol: %q\n    permission: allow\n    enabled: true\n    timeout: 20s\n",
				dialect, mode, dialect, mode, agentBin, dialect, mode, protocol)
		}
	}
	// A hang caught by the silence limit rather than the timeout.
	fmt.Fprintf(&b, "  - id: acp-hang-silent\n    command: [%q, -dialect, acp, -mode, hang]\n    protocol: acp\n    enabled: true\n    timeout: 10m\n    silence_timeout: 1s\n", agentBin)
	node := filepath.Join(repoRoot, "node_modules", ".bin", "node")
	example := filepath.Join(repoRoot, "node_modules", "@agentclientprotocol", "sdk", "dist", "examples", "agent.js")
	fmt.Fprintf(&b, "  - id: npm-example\n    name: the example agent of @agentclientprotocol/sdk\n    command: [%q, %q]\n    protocol: acp\n    permission: allow\n    enabled: true\n    timeout: 60s\n", node, example)
	tools := filepath.Join(repoRoot, "examples", "tool-agents", "agents")
	slow := filepath.Join(t.TempDir(), "slow.sh")
	if err := os.WriteFile(slow, []byte("echo sleeping >&2\nexec sleep 60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "  - id: oneshot-labels\n    command: [python3, %q]\n    protocol: oneshot\n    args: {issue_number: --issue, repo_name: --repo}\n    enabled: true\n    timeout: 30s\n", filepath.Join(tools, "stdin_agent.py"))
	fmt.Fprintf(&b, "  - id: oneshot-fails\n    command: [python3, %q]\n    protocol: oneshot\n    enabled: true\n    timeout: 30s\n", filepath.Join(tools, "failing_agent.py"))
	fmt.Fprintf(&b, "  - id: oneshot-slow\n    command: [/bin/sh, %q]\n    protocol: oneshot\n    enabled: true\n    timeout: 90s\n", slow)
	fmt.Fprintf(&b, "  - id: needs-env\n    command: [%q]\n    required_env: [API_KEY]\n    enabled: true\n", agentBin)
	fmt.Fprintf(&b, "  - id: disabled-agent\n    command: [%q]\n    enabled: false\n", agentBin)
	// Agents that offer an auth method and open no session until it is
	// used: a type that names it, one that names none, one that names
	// another; and the example agent under the deny policy.
	for id, method := range map[string]string{"acp-auth": "test-key", "acp-auth-none": "", "acp-auth-other": "other-key"} {
		fmt.Fprintf(&b, "  - id: %s\n    command: [%q, -dialect, acp, -auth, test-key]\n    protocol: acp\n    permission: allow\n    auth_method: %q\n    timeout: 20s\n", id, agentBin, method)
	}
	fmt.Fprintf(&b, "  - id: acp-deny\n    command: [%q, -dialect, acp]\n    protocol: acp\n    permission: deny\n    timeout: 20s\n", agentBin)
	// An agent whose process outlives its stdin and its stdout (the
	// example agent exits on either; the shell does not) and leaves a child
	// running in its process group (the child writes child.pid in the
	// workspace).
	withChild := filepath.Join(t.TempDir(), "with-child.sh")
	if err := os.WriteFile(withChild, fmt.Appendf(nil, "sleep 300 </dev/null >/dev/null 2>&1 &\necho $! > child.pid\n%q -dialect acp\nsleep 300\n", agentBin), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "  - id: acp-lingering-group\n    command: [/bin/sh, %q]\n    protocol: acp\n    permission: allow\n    enabled: true\n    timeout: 5m\n", withChild)
	writeHookTypes(t, &b, node, example)
	path := filepath.Join(t.TempDir(), "agent-types.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func testConfig(t testing.TB, root string, overrides map[string]string) service.Config {
	t.Helper()
	env := map[string]string{
		"CONCLAVE_RUNNER_GRPC_ADDR":             "127.0.0.1:0",
		"CONCLAVE_RUNNER_HTTP_ADDR":             "127.0.0.1:0",
		"CONCLAVE_RUNNER_SERVER_ID":             "runner-test",
		"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "true",
		"CONCLAVE_RUNNER_WORKSPACE_ROOTS":       root,
		"CONCLAVE_RUNNER_AGENT_TYPES":           agentTypes(t),
		"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT":      "10s", // node starts slowly on a busy machine
		"CONCLAVE_RUNNER_CANCEL_GRACE":          "2s",
		"CONCLAVE_RUNNER_IDLE_TIMEOUT":          "1m",
		"CONCLAVE_RUNNER_LAUNCH_RETRY":          "2s",
		// The tests poll; the rate limit has a test of its own.
		"CONCLAVE_RUNNER_CLIENT_RATE":  "1000000",
		"CONCLAVE_RUNNER_CLIENT_BURST": "1000000",
	}
	for k, v := range overrides {
		env[k] = v
	}
	var cfg struct{ Runner service.Config }
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := config.Load(context.Background(), &cfg, "runner", nil, lookup, io.Discard); err != nil {
		t.Fatal(err)
	}
	return cfg.Runner
}

type testRunner struct {
	*service.Runner
	base  string
	q     queue.Queue
	root  string
	cfg   service.Config
	token string
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// sharedState is the configuration, store and queue of runners that are
// replicas of one another: each run on them with runOn has listeners of
// its own.
func sharedState(t testing.TB, overrides map[string]string) (service.Config, store.Store, queue.Queue) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "workspaces")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, root, overrides)
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return cfg, st, q
}

// startRunner runs a runner on loopback over its own embedded store and
// queue, with a workspace root of its own.
func startRunner(t testing.TB, overrides map[string]string) *testRunner {
	t.Helper()
	return startRunnerWith(t, overrides, nil)
}

// startRunnerWith is startRunner with a telemetry provider (nil: its own).
func startRunnerWith(t testing.TB, overrides map[string]string, tel *telemetry.Provider) *testRunner {
	t.Helper()
	cfg, st, q := sharedState(t, overrides)
	r, _ := runOn(t, cfg, st, q, tel)
	return r
}

// runOn runs a runner with cfg on st and q until the test ends or stop is
// called; stop returns Run's error.
func runOn(t testing.TB, cfg service.Config, st store.Store, q queue.Queue, tel *telemetry.Provider) (*testRunner, func() error) {
	t.Helper()
	return runOnWith(t, cfg, st, q, tel, nil)
}

// runOnWith is runOn with an executor (nil: the local one).
func runOnWith(t testing.TB, cfg service.Config, st store.Store, q queue.Queue, tel *telemetry.Provider, exec executor.Executor) (*testRunner, func() error) {
	t.Helper()
	var err error
	root := cfg.WorkspaceRoots[0]
	ctx := context.Background()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	for _, d := range service.Queues(cfg) {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if tel == nil {
		if tel, err = telemetry.New(ctx, telemetry.Config{ServiceName: "runner-test"}); err != nil {
			t.Fatal(err)
		}
	}
	logger := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := service.New(cfg, service.Deps{Store: st, Queue: q, Logger: logger, Telemetry: tel, Executor: exec})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	var (
		once   sync.Once
		runErr error
	)
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("runner.Run: %v", err)
		}
	})
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("runner stopped: %v", err)
	}
	var base string
	for _, e := range r.Endpoints() {
		if strings.HasPrefix(e.Protocol, "HTTP") {
			base = "http://" + e.Address
		}
	}
	return &testRunner{Runner: r, base: base, q: q, root: root, cfg: cfg}, stop
}

// workspace makes a directory under the runner's allowed root.
func (r *testRunner) workspace(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(r.root, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// do sends a REST request and decodes the JSON answer into out.
func (r *testRunner) do(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, r.base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

type instance struct {
	ID          string `json:"id"`
	TaskID      string `json:"task_id"`
	AgentType   string `json:"agent_type"`
	ContainerID string `json:"container_id"`
	Status      string `json:"status"`
	Progress    int    `json:"progress"`
	StartedAt   string `json:"started_at"`
	FinishedAt  string `json:"finished_at"`
	Error       string `json:"error"`
}

type errorBody struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Details    string `json:"details"`
	HTTPStatus int    `json:"http_status"`
}

func (r *testRunner) launch(t *testing.T, agentType, workspace string, env map[string]string) instance {
	t.Helper()
	var in instance
	if code := r.do(t, "POST", "/api/v1/agents/launch", map[string]any{
		"task_id": "task-" + strings.ReplaceAll(t.Name(), "/", "-"), "agent_type": agentType, "workspace_path": workspace, "env": env, "priority": 1, "metadata": map[string]any{"origin": "test"},
	}, &in); code != http.StatusOK {
		t.Fatalf("launch %s: HTTP %d %+v", agentType, code, in)
	}
	return in
}

func (r *testRunner) status(t *testing.T, id string) instance {
	t.Helper()
	var in instance
	if code := r.do(t, "GET", "/api/v1/agents/"+id+"/status", nil, &in); code != http.StatusOK {
		t.Fatalf("status: HTTP %d", code)
	}
	return in
}

// waitTimeout bounds the waits for an instance's status and log lines: far
// longer than any of them takes, it only keeps a hang from running into
// the whole run's timeout.
const waitTimeout = 2 * time.Minute

// waitStatus polls until the instance reaches one of want.
func (r *testRunner) waitStatus(t *testing.T, id string, want ...string) instance {
	t.Helper()
	var in instance
	testenv.EventuallyNoError(t, waitTimeout, fmt.Sprintf("%s to be %v", id, want), func() error {
		in = r.status(t, id)
		if !slices.Contains(want, in.Status) {
			return fmt.Errorf("status %s", in.Status)
		}
		return nil
	})
	return in
}

type logLine struct {
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

func (r *testRunner) logs(t *testing.T, id string) []logLine {
	t.Helper()
	var out struct {
		Lines []logLine `json:"lines"`
	}
	if code := r.do(t, "GET", "/api/v1/agents/"+id+"/logs?tail=1000", nil, &out); code != http.StatusOK {
		t.Fatalf("logs: HTTP %d", code)
	}
	return out.Lines
}

// waitLog polls the logs until a line contains want.
func (r *testRunner) waitLog(t *testing.T, id, want string) {
	t.Helper()
	r.waitLogWithin(t, id, want, waitTimeout)
}

func hasLog(lines []logLine, want string) bool {
	for _, l := range lines {
		if strings.Contains(l.Text, want) {
			return true
		}
	}
	return false
}

// waitLogWithin is waitLog bounded by d: past it the test fails, with the
// log so far.
func (r *testRunner) waitLogWithin(t *testing.T, id, want string, d time.Duration) {
	t.Helper()
	testenv.EventuallyNoError(t, d, fmt.Sprintf("log line %q of %s", want, id), func() error {
		if lines := r.logs(t, id); !hasLog(lines, want) {
			return fmt.Errorf("the log: %+v", lines)
		}
		return nil
	})
}
