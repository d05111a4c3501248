package hybrid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// systemPython is the real executable behind python3 on PATH: version
// managers put shell shims there that add their own environment.
var systemPython = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	return strings.TrimSpace(string(out)), err
})

// python3 is the system interpreter the agents of these tests run with.
func python3(t *testing.T) string {
	t.Helper()
	p, err := systemPython()
	if err != nil || p == "" {
		t.Fatalf("python3 is required to run the agents of these tests: %v", err)
	}
	return p
}

// agent writes a Python agent into a fresh workspace and returns it ready to
// run.
func agent(t *testing.T, source string) *Agent {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.py")
	if err := os.WriteFile(script, []byte(source), 0o644); err != nil {
		t.Fatal(err)
	}
	return &Agent{
		Name: "test_agent", Interpreter: python3(t), Script: script, Dir: dir,
		Env:     []string{"PYTHONPATH=" + dir, "PATH=/usr/bin:/bin"},
		Flags:   []Flag{{"issue_number", "--issue"}, {"repo_name", "--repo"}, {"dry_run", "--dry-run"}},
		Timeout: time.Minute, ValidateInputs: true,
	}
}

const echoAgent = `
import json, os, sys
params = json.load(sys.stdin)
print(json.dumps({"status": "success", "data": {"params": params, "argv": sys.argv[1:], "cwd": os.getcwd(),
  "env": dict(os.environ)}}))
`

func TestRunHybridProtocol(t *testing.T) {
	t.Parallel()
	a := agent(t, echoAgent)
	a.Env = append(a.Env, "GITHUB_TOKEN=allowed")
	params := map[string]any{"repo_name": "owner/repo", "issue_number": json.Number("123"), "dry_run": true, "extra": map[string]any{"k": "v"}}
	r, err := Run(context.Background(), a, params)
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Params map[string]any
		Argv   []string
		Cwd    string
		Env    map[string]string
	}
	if err := json.Unmarshal(r.Data, &data); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(data.Argv, " "); got != "--issue=123 --repo=owner/repo --dry-run" {
		t.Errorf("argv = %q", got)
	}
	if data.Params["repo_name"] != "owner/repo" || data.Params["issue_number"] != float64(123) || testenv.At[map[string]any](t, data.Params, "extra")["k"] != "v" {
		t.Errorf("stdin params = %v", data.Params)
	}
	if data.Cwd != a.Dir {
		t.Errorf("cwd = %s, want %s", data.Cwd, a.Dir)
	}
	if data.Env["PYTHONPATH"] != a.Dir || data.Env["GITHUB_TOKEN"] != "allowed" {
		t.Errorf("env = %v", data.Env)
	}
	for k := range data.Env {
		switch k {
		case "PYTHONPATH", "PATH", "GITHUB_TOKEN", "LC_CTYPE":
		default:
			t.Errorf("agent saw %s, which was not allowed", k)
		}
	}
}

// Shell metacharacters reach the agent as literal bytes, in argv and on
// stdin, and nothing they would do in a shell happens.
func TestRunMetacharactersAreLiteral(t *testing.T) {
	t.Parallel()
	a := agent(t, echoAgent)
	a.ValidateInputs = false // repo_name's pattern would reject them first
	marker := filepath.Join(a.Dir, "pwned")
	evil := "x; touch " + marker + " && echo $(touch " + marker + ") `touch " + marker + "` | cat > " + marker + " *"
	r, err := Run(context.Background(), a, map[string]any{"repo_name": evil, "query": evil})
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Params map[string]any
		Argv   []string
	}
	if err := json.Unmarshal(r.Data, &data); err != nil {
		t.Fatal(err)
	}
	if len(data.Argv) != 1 || data.Argv[0] != "--repo="+evil || data.Params["query"] != evil {
		t.Fatalf("agent got argv %q params %v", data.Argv, data.Params)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a metacharacter was interpreted: %s exists (%v)", marker, err)
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, source string
		params       map[string]any
		kind         Kind
		msg, details string
		exitCode     int
	}{
		{"agent error exit 1", `import json,sys; print(json.dumps({"status":"error","error":"Invalid input: no repo","details":"ctx"})); sys.exit(1)`,
			nil, KindExecution, "exited with code 1: Invalid input: no repo", "ctx", 1},
		{"specific exit code", `import sys; sys.stderr.write("boom\n"); sys.exit(3)`, nil, KindExecution, "exited with code 3", "", 3},
		{"exception", `raise ValueError("bad")`, nil, KindExecution, "exited with code 1", "", 1},
		{"non-zero with junk", `print("oops"); raise SystemExit(2)`, nil, KindExecution, "exited with code 2", "oops", 2},
		{"signal", `import os,signal; os.kill(os.getpid(), signal.SIGKILL)`, nil, KindExecution, "killed by signal killed", "", -1},
		{"non-json", `print("hello")`, nil, KindInvalidJSON, "not a JSON object", "hello", 0},
		{"debug print", `import json; print("DEBUG x=1"); print(json.dumps({"status":"success"}))`, nil, KindInvalidJSON, "before its JSON object", "DEBUG x=1", 0},
		{"empty stdout", `pass`, nil, KindInvalidJSON, "wrote nothing", "", 0},
		{"validation", `print("{}")`, map[string]any{"repo_name": "not a repo"}, KindValidation, "Invalid repo_name format", "", -1},
		{"one megabyte string", `print("{}")`, map[string]any{"q": strings.Repeat("a", 1<<20)}, KindValidation, "1048576 characters long", "", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := agent(t, tt.source)
			r, err := Run(context.Background(), a, tt.params)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Run = %+v, %v; want a %s error", r, err, tt.kind)
			}
			if e.Kind != tt.kind || !strings.Contains(e.Error(), tt.msg) || !strings.Contains(e.Details, tt.details) || e.ExitCode != tt.exitCode {
				t.Fatalf("Run error = %+v (%q); want kind %s, message with %q, details with %q, exit %d", e, e.Error(), tt.kind, tt.msg, tt.details, tt.exitCode)
			}
		})
	}
}

func TestRunAgentSideErrorIsAResponse(t *testing.T) {
	t.Parallel()
	a := agent(t, `import json; print(json.dumps({"status":"error","error":"Unexpected error: nope"}))`)
	r, err := Run(context.Background(), a, nil)
	if err != nil || r.Status != StatusError || r.Error != "Unexpected error: nope" {
		t.Fatalf("Run = %+v, %v", r, err)
	}
}

func TestRunNotFound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.py")
	if err := os.WriteFile(script, []byte("print('{}')"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "secret.py")
	if err := os.WriteFile(unreadable, []byte("print('{}')"), 0o000); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		a    Agent
		msg  string
	}{
		{"missing script", Agent{Interpreter: python3(t), Script: filepath.Join(dir, "nope.py")}, "script " + filepath.Join(dir, "nope.py") + " does not exist"},
		{"missing interpreter", Agent{Interpreter: filepath.Join(dir, "venv/bin/python"), Script: script}, "interpreter " + filepath.Join(dir, "venv/bin/python") + " does not exist"},
		{"interpreter not executable", Agent{Interpreter: script, Script: script}, "is not executable"},
		{"script not executable without interpreter", Agent{Script: script}, "is not executable"},
		{"interpreter not in PATH", Agent{Interpreter: "python3.99", Script: script}, "interpreter python3.99 was not found in PATH"},
		{"workspace missing", Agent{Interpreter: python3(t), Script: script, Dir: filepath.Join(dir, "gone")}, "workspace " + filepath.Join(dir, "gone") + " is not an accessible directory"},
		{"script is a directory", Agent{Interpreter: python3(t), Script: dir}, "is a directory"},
	}
	if os.Geteuid() != 0 { // root reads everything
		tests = append(tests, struct {
			name string
			a    Agent
			msg  string
		}{"script unreadable", Agent{Interpreter: python3(t), Script: unreadable}, "is not readable"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := tt.a
			a.Name = "x"
			if a.Dir == "" {
				a.Dir = dir
			}
			_, err := Run(context.Background(), &a, nil)
			if KindOf(err) != KindNotFound || !strings.Contains(err.Error(), tt.msg) || !strings.HasPrefix(err.Error(), "Agent not found: ") {
				t.Fatalf("Run = %v, want Agent not found with %q", err, tt.msg)
			}
		})
	}
}

func TestRunStdoutLimit(t *testing.T) {
	t.Parallel()
	// 100 MB, written as fast as Python can; the bridge keeps 1 MiB.
	a := agent(t, `import sys
chunk = "x" * (1 << 20)
for _ in range(100):
    sys.stdout.write(chunk)
sys.stdout.flush()
`)
	a.MaxStdout = 1 << 20
	_, err := Run(context.Background(), a, nil)
	if KindOf(err) != KindOutputTooLarge || !strings.Contains(err.Error(), "more than 1048576 bytes") {
		t.Fatalf("Run = %v, want output too large", err)
	}
}

func TestRunExactlyAtStdoutLimit(t *testing.T) {
	t.Parallel()
	body := `{"status":"success","data":"` + strings.Repeat("y", 100) + `"}`
	a := agent(t, "import sys; sys.stdout.write('"+body+"')")
	a.MaxStdout = int64(len(body))
	if r, err := Run(context.Background(), a, nil); err != nil || r.Status != StatusSuccess {
		t.Fatalf("Run = %v, %v", r, err)
	}
}

// pidOf waits for an agent to report a process id in file.
func pidOf(t *testing.T, file string) int {
	t.Helper()
	var b []byte
	testenv.Eventually(t, time.Minute, "a pid in "+file, func() bool {
		var err error
		b, err = os.ReadFile(file)
		return err == nil && strings.HasSuffix(string(b), "\n")
	})
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// gone waits until pid no longer runs (it may linger as a zombie when no
// init reaps it, which is not running).
func gone(t *testing.T, pid int) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("process %d to end", pid), func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
	})
}

const grandchildSource = `
import json, os, subprocess, sys, time
child = subprocess.Popen(["sleep", "1000"], stdout=sys.stdout)
with open(os.path.join(os.getcwd(), "grandchild.pid.tmp"), "w") as f:
    f.write(str(child.pid) + "\n")
os.rename("grandchild.pid.tmp", "grandchild.pid")
`

func TestRunKillsGrandchildThatOutlivesAgent(t *testing.T) {
	t.Parallel()
	// The agent answers and exits, leaving a grandchild that holds stdout.
	a := agent(t, grandchildSource+`print(json.dumps({"status":"success","data":"left a child"}))
sys.stdout.flush()
os._exit(0)
`)
	r, err := Run(context.Background(), a, nil)
	if err != nil || r.Status != StatusSuccess {
		t.Fatalf("Run = %v, %v", r, err)
	}
	gone(t, pidOf(t, filepath.Join(a.Dir, "grandchild.pid")))
}

func TestRunTimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	a := agent(t, grandchildSource+"time.sleep(1000)\n")
	a.Timeout = 3 * time.Second
	_, err := Run(context.Background(), a, nil)
	if KindOf(err) != KindTimeout || !strings.Contains(err.Error(), "timeout of 3s") {
		t.Fatalf("Run = %v, want a timeout", err)
	}
	gone(t, pidOf(t, filepath.Join(a.Dir, "grandchild.pid")))
}

func TestRunCancelKillsGroup(t *testing.T) {
	t.Parallel()
	a := agent(t, grandchildSource+"time.sleep(1000)\n")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := Run(ctx, a, nil); done <- err }()
	pid := pidOf(t, filepath.Join(a.Dir, "grandchild.pid"))
	cancel()
	if err := <-done; KindOf(err) != KindCancelled {
		t.Fatalf("Run = %v, want cancelled", err)
	}
	gone(t, pid)
}

func TestRunForwardsStderr(t *testing.T) {
	t.Parallel()
	a := agent(t, `import json, sys
sys.stderr.write("[INFO] started\n")
sys.stderr.write("y" * 20000 + "\n")
sys.stderr.write("[INFO] done\n")
print(json.dumps({"status":"success"}))`)
	var mu sync.Mutex
	var lines []string
	a.Stderr = func(l string) { mu.Lock(); lines = append(lines, l); mu.Unlock() }
	if _, err := Run(context.Background(), a, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 3 || lines[0] != "[INFO] started" || !strings.HasSuffix(lines[1], "[line cut]") || len(lines[1]) > maxStderrLine+20 || lines[2] != "[INFO] done" {
		t.Fatalf("stderr lines = %d %q", len(lines), lines)
	}
}

func TestRunFloodedStderrIsBounded(t *testing.T) {
	t.Parallel()
	a := agent(t, `import json, sys
line = "z" * 99 + "\n"
for _ in range(30000):
    sys.stderr.write(line)
print(json.dumps({"status":"success"}))`)
	var n, total int
	a.Stderr = func(l string) { n++; total += len(l) }
	if _, err := Run(context.Background(), a, nil); err != nil {
		t.Fatal(err)
	}
	if total > maxStderrBytes+100 || n > maxStderrBytes/99+2 {
		t.Fatalf("forwarded %d lines, %d bytes of stderr", n, total)
	}
}

func TestRunLargeStdinToAgentThatIgnoresIt(t *testing.T) {
	t.Parallel()
	a := agent(t, `import json; print(json.dumps({"status":"success"}))`)
	a.ValidateInputs = false
	if _, err := Run(context.Background(), a, map[string]any{"q": strings.Repeat("a", 4<<20)}); err != nil {
		t.Fatal(err)
	}
}

// Not parallel: writing an executable while other tests fork can leave its
// descriptor open in a child for a moment, and exec then fails with ETXTBSY.
func TestRunScriptWithoutInterpreter(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "agent.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat >/dev/null\necho '{\"status\":\"success\",\"data\":\"sh\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := Run(context.Background(), &Agent{Name: "sh", Script: script, Dir: dir}, nil)
	if err != nil || string(r.Data) != `"sh"` {
		t.Fatalf("Run = %+v, %v", r, err)
	}
}

func TestRunBadShebangIsNotFound(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "agent")
	if err := os.WriteFile(script, []byte("#!/no/such/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), &Agent{Name: "x", Script: script, Dir: dir}, nil)
	if KindOf(err) != KindNotFound {
		t.Fatalf("Run = %v", err)
	}
}
