package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
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
			// A hanging agent is ended by its timeout, which TestFailures
			// waits for; every other launch gets room for a loaded machine
			// (on a fresh CI machine a conversation that outlived 20 s
			// across a runner's restart was failed as timed out).
			timeout := "2m"
			if mode == "hang" {
				timeout = "20s"
			}
			fmt.Fprintf(&b, "  - id: %s-%s\n    name: example %s %s\n    command: [%q, -dialect, %s, -mode, %s]\n    protocol: %q\n    permission: allow\n    enabled: true\n    timeout: %s\n",
				dialect, mode, dialect, mode, agentBin, dialect, mode, protocol, timeout)
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
	return runnertest.Config(t, env)
}

type testRunner struct {
	*service.Runner
	*runnertest.API
	q    queue.Queue
	root string
	cfg  service.Config
}

type (
	instance = runnertest.Instance
	logLine  = runnertest.LogLine
)

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
	st, q := runnertest.State(t, cfg)
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
	runnertest.Prepare(t, cfg, st, q)
	if tel == nil {
		var err error
		if tel, err = telemetry.New(context.Background(), telemetry.Config{ServiceName: "runner-test"}); err != nil {
			t.Fatal(err)
		}
	}
	r, api, stop := runnertest.Start(t, cfg, service.Deps{Store: st, Queue: q, Logger: runnertest.Logger(t, slog.LevelDebug), Telemetry: tel, Executor: exec})
	return &testRunner{Runner: r, API: api, q: q, root: cfg.WorkspaceRoots[0], cfg: cfg}, stop
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

type errorBody struct {
	Error      string `json:"error"`
	Message    string `json:"message"`
	Details    string `json:"details"`
	HTTPStatus int    `json:"http_status"`
}
