package service_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bridge/bridgetest"
	"github.com/conclave-ai/conclave/services/bridge/service"
)

// bridgeBin is the bridge binary, built once: `bridge mcp` is the same code
// as `conclave bridge mcp`.
var bridgeBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, remove, err := testenv.GoBuildTemp(context.Background(), "bridge-bin", "./services/bridge/cmd/bridge")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer remove()
		bridgeBin = filepath.Join(dir, "bridge")
		return m.Run()
	}())
}

// systemPython is the real interpreter behind python3 (version managers put
// slow shell shims on PATH).
var systemPython = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	return strings.TrimSpace(string(out)), err
})

func examplesDir(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs("../../../examples/tool-agents")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// testAgents are agents that misbehave, beside the four examples.
var testAgents = map[string]string{
	"echo.py": `import json, sys
params = json.load(sys.stdin)
print(json.dumps({"status": "success", "data": {"params": params, "argv": sys.argv[1:]}}))
`,
	"flood.py": `import sys
chunk = "x" * (1 << 20)
for _ in range(100):
    sys.stdout.write(chunk)
`,
	"hang.py": `import time
time.sleep(1000)
`,
	"grandchild.py": `import json, os, subprocess, sys
child = subprocess.Popen(["sleep", "1000"])
with open("grandchild.pid.tmp", "w") as f:
    f.write(str(child.pid) + "\n")
os.rename("grandchild.pid.tmp", "grandchild.pid")
print(json.dumps({"status": "success", "data": child.pid}))
`,
	"hang_with_child.py": `import os, subprocess, time
with open("hang_agent.pid.tmp", "w") as f:
    f.write(str(os.getpid()) + "\n")
os.rename("hang_agent.pid.tmp", "hang_agent.pid")
child = subprocess.Popen(["sleep", "1000"])
with open("hang_child.pid.tmp", "w") as f:
    f.write(str(child.pid) + "\n")
os.rename("hang_child.pid.tmp", "hang_child.pid")
time.sleep(1000)
`,
	"debug_print.py": `import json
print("DEBUG: got here")
print(json.dumps({"status": "success", "data": 1}))
`,
	"gated.py": `import json, os, time
open("gated.started", "w").close()
while not os.path.exists("gated.release"):
    time.sleep(0.01)
print(json.dumps({"status": "success", "data": "released"}))
`,
	"slow.py": `import json, sys, time
time.sleep(1.5)
print(json.dumps({"status": "success", "data": "slow"}))
`,
}

// workspace writes a config.yaml naming the example agents and the
// misbehaving ones into a fresh directory, and returns its path.
func workspace(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for name, src := range testAgents {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	py, err := systemPython()
	if err != nil {
		t.Fatalf("python3 is required: %v", err)
	}
	ex := examplesDir(t)
	cfg := fmt.Sprintf(`workspace: .
security: {validate_inputs: true, max_param_length: 10000}
agents:
  label_github_issue:
    path: %[2]s/agents/stdin_agent.py
    python: %[1]s
    args: {issue_number: --issue, repo_name: --repo, dry_run: --dry-run}
    parameters:
      type: object
      properties:
        repo_name: {type: string}
        issue_number: {type: integer}
        dry_run: {type: boolean}
      required: [repo_name, issue_number]
  triage_cli:
    path: %[2]s/agents/cli_agent.py
    python: %[1]s
    args: {issue_number: --issue, repo_name: --repo, dry_run: --dry-run}
  watch_collect:
    path: %[2]s/agents/hybrid_agent.py
    python: %[1]s
    args: {repo_name: --repo}
  always_fails:
    path: %[2]s/agents/failing_agent.py
    python: %[1]s
  echo:
    path: echo.py
    python: %[1]s
    args: {query: --query}
  flood:
    path: flood.py
    python: %[1]s
    max_output_bytes: 1048576
  hang:
    path: hang.py
    python: %[1]s
    timeout: 2
  grandchild:
    path: grandchild.py
    python: %[1]s
  hang_with_child:
    path: hang_with_child.py
    python: %[1]s
  debug_print:
    path: debug_print.py
    python: %[1]s
  gated:
    path: gated.py
    python: %[1]s
  slow:
    path: slow.py
    python: %[1]s
  missing:
    path: not_there.py
    python: %[1]s
`, py, ex)
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const testToken = "bridge-test-token"

type httpBridge struct {
	url     string // the MCP endpoint
	base    string
	metrics string
	dir     string
	// shutdown stops the bridge as SIGTERM does and returns Run's result;
	// later calls return the same result.
	shutdown func() error
}

// startHTTP runs the bridge's HTTP server in process on a loopback port.
func startHTTP(t testing.TB, mutate func(*service.Config)) *httpBridge {
	t.Helper()
	cfgPath := workspace(t)
	cfg := service.Config{
		ConfigFile: cfgPath, HTTPAddr: "127.0.0.1:0", Tokens: []string{testToken},
		// net/http's Shutdown counts a connection on which no request has
		// arrived yet as busy for 5 s; a client transport may hold such a
		// spare connection, so the drain gets longer than that.
		ShutdownTimeout: 15 * time.Second, ProgressInterval: 100 * time.Millisecond,
		MaxRequestBytes: 4 << 20, Rate: 1000, Burst: 1000, MaxRunning: 16, Env: os.LookupEnv, Version: "test",
	}
	if mutate != nil {
		mutate(&cfg)
	}
	b := bridgetest.Serve(t, cfg, "bridge-test")
	return &httpBridge{url: b.MCP(), base: b.Base, metrics: b.Base + "/metrics", dir: filepath.Dir(cfgPath), shutdown: b.Shutdown}
}

// connectHTTP opens an MCP client session with the Go SDK's streamable HTTP
// client.
func connectHTTP(t testing.TB, b *httpBridge, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	return bridgetest.Connect(t, b.url, testToken, "bridge-test", opts)
}
