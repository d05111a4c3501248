package agentconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/hybrid"
)

func write(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoad(t *testing.T) {
	t.Parallel()
	path := write(t, `
workspace: ws
security:
  validate_inputs: false
  max_param_length: 500
environment:
  pass: [PATH]
agents:
  label_github_issue:
    path: agent/main.py
    python: adk-env/bin/python
    timeout: 600
    description: Labels issues.
    args: {issue_number: --issue, repo_name: --repo, dry_run: --dry-run}
    env: [GITHUB_TOKEN, MISSING]
    parameters:
      type: object
      properties: {repo_name: {type: string}}
  quick:
    path: /abs/quick.py
    timeout: 1m30s
  tool:
    path: bin/tool
    executable: true
    governed: true
    risk: "high: writes to the tracker"
    approval_timeout: 2m
`)
	cfg, err := Load(path, "", env(map[string]string{"PATH": "/bin", "GITHUB_TOKEN": "t", "SECRET": "s"}))
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(filepath.Dir(path), "ws")
	if cfg.Workspace != ws || cfg.ValidateInputs || cfg.MaxParamLength != 500 || len(cfg.Agents) != 3 {
		t.Fatalf("config = %+v", cfg)
	}
	a, ok := cfg.Agent("label_github_issue")
	if !ok {
		t.Fatal("agent missing")
	}
	r := a.Run
	if r.Interpreter != filepath.Join(ws, "adk-env/bin/python") || r.Script != filepath.Join(ws, "agent/main.py") || r.Dir != ws ||
		r.Timeout != 600*time.Second || r.MaxStdout != hybrid.DefaultMaxStdout || r.ValidateInputs || r.MaxParamLength != 500 {
		t.Fatalf("agent = %+v", r)
	}
	if got := strings.Join(r.Env, " "); got != "PYTHONPATH="+ws+" PATH=/bin GITHUB_TOKEN=t" {
		t.Fatalf("env = %q", got)
	}
	if len(r.Flags) != 3 || r.Flags[0] != (hybrid.Flag{Param: "dry_run", Flag: "--dry-run"}) {
		t.Fatalf("flags = %v", r.Flags)
	}
	q, _ := cfg.Agent("quick")
	if q.Run.Script != "/abs/quick.py" || q.Run.Timeout != 90*time.Second || string(q.InputSchema) != `{"type":"object"}` || q.Description == "" {
		t.Fatalf("quick = %+v", q)
	}
	if tool, _ := cfg.Agent("tool"); tool.Run.Interpreter != "" || tool.Run.Script != filepath.Join(ws, "bin/tool") ||
		!tool.Governed || tool.Risk != "high: writes to the tracker" || tool.ApprovalTimeout != 2*time.Minute {
		t.Fatalf("executable, governed agent = %+v", tool)
	}
	if a.Governed || q.Governed {
		t.Fatal("an agent is governed without governed: true")
	}
	if _, ok := cfg.Agent("nope"); ok {
		t.Fatal("unknown agent found")
	}
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	path := write(t, "agents:\n  a:\n    path: a.py\n")
	cfg, err := Load(path, "", env(map[string]string{"PATH": "/usr/bin", "HOME": "/h", "LANG": "C", "AWS_SECRET_ACCESS_KEY": "x"}))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Agents[0].Run
	if cfg.Workspace != filepath.Dir(path) || !cfg.ValidateInputs || cfg.MaxParamLength != 10_000 || a.Timeout != 300*time.Second {
		t.Fatalf("defaults: %+v %+v", cfg, a)
	}
	for _, kv := range a.Env {
		if strings.HasPrefix(kv, "AWS_") {
			t.Fatalf("agent inherits %s without being allowed", kv)
		}
	}
	if len(a.Env) != 4 {
		t.Fatalf("env = %v", a.Env)
	}
	cfg, err = Load(path, "/override", env(nil))
	if err != nil || cfg.Workspace != "/override" || cfg.Agents[0].Run.Script != "/override/a.py" {
		t.Fatalf("workspace override: %+v %v", cfg, err)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, body, want string }{
		{"not yaml", "agents: [", "did not find expected"},
		{"unknown key", "agents:\n  a:\n    path: a.py\n    pyhton: x\n", "field pyhton not found"},
		{"no agents", "security: {validate_inputs: true}\n", "agents: no agents configured"},
		{"no path", "agents:\n  a:\n    timeout: 3\n", "agents.a.path: required"},
		{"bad name", "agents:\n  'a b':\n    path: a.py\n", `agents.a b.name: "a b" is not a tool name`},
		{"reserved name", "agents:\n  health_check:\n    path: a.py\n", "the bridge's own tool"},
		{"negative timeout", "agents:\n  a:\n    path: a.py\n    timeout: -1\n", "agents.a.timeout: must be positive"},
		{"bad timeout", "agents:\n  a:\n    path: a.py\n    timeout: soon\n", `timeout "soon" is neither`},
		{"bad max length", "security: {max_param_length: 0}\nagents:\n  a:\n    path: a.py\n", "security.max_param_length: must be a positive"},
		{"schema not object", "agents:\n  a:\n    path: a.py\n    parameters: {type: string}\n", "agents.a.parameters: must be a JSON Schema with type: object"},
		{"schema invalid", "agents:\n  a:\n    path: a.py\n    parameters: {type: object, properties: {x: {type: 5}}}\n", "agents.a.parameters: is not"},
		{"bad flag", "agents:\n  a:\n    path: a.py\n    args: {repo_name: 'repo; rm'}\n", "agents.a.args.repo_name"},
		{"bad env", "agents:\n  a:\n    path: a.py\n    env: ['A=B']\n", "agents.a.env[0]"},
		{"bad pass", "environment: {pass: ['1X']}\nagents:\n  a:\n    path: a.py\n", "environment.pass[0]"},
		{"executable with python", "agents:\n  a:\n    path: a\n    executable: true\n    python: python3\n", "agents.a.executable: an executable script runs by itself"},
		{"risk without governed", "agents:\n  a:\n    path: a.py\n    risk: high\n", "agents.a.governed: risk and approval_timeout are for governed tools"},
		{"bad approval_timeout", "agents:\n  a:\n    path: a.py\n    governed: true\n    approval_timeout: 0\n", "agents.a.approval_timeout: must be positive"},
		{"bad max output", "agents:\n  a:\n    path: a.py\n    max_output_bytes: 0\n", "agents.a.max_output_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := write(t, tt.body)
			_, err := Load(path, "", env(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), path) {
				t.Fatalf("Load = %v, want an error starting with %s and containing %q", err, path, tt.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	t.Parallel()
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), "", env(nil))
	if err == nil || !strings.Contains(err.Error(), "CONCLAVE_BRIDGE_CONFIG") {
		t.Fatalf("Load = %v", err)
	}
}

func TestSchemaValidation(t *testing.T) {
	t.Parallel()
	path := write(t, "agents:\n  a:\n    path: a.py\n    parameters: {type: object, properties: {n: {type: integer}}, required: [n]}\n")
	cfg, err := Load(path, "", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Agents[0]
	if err := a.ValidateSchema(map[string]any{"n": 3.0}); err != nil {
		t.Fatal(err)
	}
	err = a.ValidateSchema(map[string]any{"n": "x"})
	if hybrid.KindOf(err) != hybrid.KindValidation || !strings.HasPrefix(err.Error(), "Validation error: parameters do not match a's schema") {
		t.Fatalf("ValidateSchema = %v", err)
	}
}
