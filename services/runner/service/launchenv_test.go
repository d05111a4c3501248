package service_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hookLaunchEnv is the launch_env of the hook-* types: prefixes wide
// enough to cover every hook variable the test sets, which are refused
// all the same.
const hookLaunchEnv = "[B*, L*, N*, P*, CALLER_*]"

// writeHookTypes adds the agent types of TestLaunchEnvHooks to b: agents
// a hook variable would make run code, in both protocols.
func writeHookTypes(t testing.TB, b *strings.Builder, node, npmExample string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A oneshot agent in bash, which reads BASH_ENV and runs cat from PATH.
	bash := write("hook-agent.sh", "cat >/dev/null\necho '{\"status\": \"success\"}'\n")
	// A oneshot agent in Python.
	python := write("hook_agent.py", "import json, sys\nsys.stdin.read()\nprint(json.dumps({\"status\": \"success\"}))\n")
	// An ACP agent started by bash, which prints its environment.
	acp := write("hook-acp.sh", fmt.Sprintf("exec %q -dialect acp -print-env\n", agentBin))
	for _, tt := range []struct{ id, command, protocol string }{
		{"hook-bash", fmt.Sprintf("[/bin/bash, %q]", bash), "oneshot"},
		{"hook-python", fmt.Sprintf("[python3, %q]", python), "oneshot"},
		{"hook-acp", fmt.Sprintf("[/bin/bash, %q]", acp), "acp"},
		{"hook-node", fmt.Sprintf("[%q, %q]", node, npmExample), "acp"},
	} {
		fmt.Fprintf(b, "  - id: %s\n    command: %s\n    protocol: %s\n    permission: allow\n    launch_env: %s\n    enabled: true\n    timeout: 60s\n",
			tt.id, tt.command, tt.protocol, hookLaunchEnv)
	}
}

// TestLaunchEnvHooks: a launch may set only what its type allows, and
// never a variable that hooks the agent's loader, shell or interpreter,
// even one the type's launch_env covers. Each hook here would leave a
// marker file behind if it ran; each launch is refused with 400
// validation_error naming the variable, creates nothing, and no marker
// appears. A variable the type allows reaches the agent.
func TestLaunchEnvHooks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a runner and agents")
	}
	t.Parallel()
	r := startRunner(t, nil)
	for i, tt := range []struct {
		name, agentType string
		// env is the launch's env, given a marker path and a directory
		// of the case's own for the hook's files.
		env func(t *testing.T, marker, dir string) map[string]string
		// named is the variable the refusal names (the first bad one in
		// order).
		named string
	}{
		{"BASH_ENV on a oneshot agent", "hook-bash", func(t *testing.T, marker, dir string) map[string]string {
			return map[string]string{"BASH_ENV": shellHook(t, dir, marker)}
		}, "BASH_ENV"},
		{"BASH_ENV on an ACP agent", "hook-acp", func(t *testing.T, marker, dir string) map[string]string {
			return map[string]string{"BASH_ENV": shellHook(t, dir, marker), "CALLER_GREETING": "hello"}
		}, "BASH_ENV"},
		{"PATH", "hook-bash", func(t *testing.T, marker, dir string) map[string]string {
			cat := filepath.Join(dir, "cat")
			if err := os.WriteFile(cat, []byte("#!/bin/sh\n: > '"+marker+"'\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			return map[string]string{"PATH": dir}
		}, "PATH"},
		{"PYTHONWARNINGS and BROWSER", "hook-python", func(t *testing.T, marker, dir string) map[string]string {
			// The warning category's module is imported: antigravity
			// opens a web browser, BROWSER (a list split at ':').
			return map[string]string{"PYTHONWARNINGS": "all:0:antigravity.x:0:0", "BROWSER": "/bin/sh -c 'echo > " + marker + "' #%s"}
		}, "BROWSER"},
		{"PYTHONPATH", "hook-python", func(t *testing.T, marker, dir string) map[string]string {
			site := filepath.Join(dir, "sitecustomize.py")
			if err := os.WriteFile(site, []byte(fmt.Sprintf("open(%q, 'w').close()\n", marker)), 0o644); err != nil {
				t.Fatal(err)
			}
			return map[string]string{"PYTHONPATH": dir}
		}, "PYTHONPATH"},
		{"NODE_OPTIONS", "hook-node", func(t *testing.T, marker, dir string) map[string]string {
			js := filepath.Join(dir, "hook.js")
			if err := os.WriteFile(js, []byte(fmt.Sprintf("require('fs').writeFileSync(%q, '')\n", marker)), 0o644); err != nil {
				t.Fatal(err)
			}
			return map[string]string{"NODE_OPTIONS": "--require=" + js}
		}, "NODE_OPTIONS"},
		{"LD_PRELOAD", "hook-python", func(t *testing.T, marker, dir string) map[string]string {
			return map[string]string{"LD_PRELOAD": preloadHook(t, dir, marker)}
		}, "LD_PRELOAD"},
		{"a platform setting", "hook-acp", func(t *testing.T, marker, dir string) map[string]string {
			return map[string]string{"CONCLAVE_AGENT_HOST_PERMISSION": "allow_always"}
		}, "CONCLAVE_AGENT_HOST_PERMISSION"},
		{"a name the type does not allow", "acp-normal", func(t *testing.T, marker, dir string) map[string]string {
			return map[string]string{"CALLER_GREETING": "hello"}
		}, "CALLER_GREETING"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			marker := filepath.Join(dir, "hook-ran")
			env := tt.env(t, marker, dir)
			env["TASK_DESCRIPTION"] = "go"
			task := fmt.Sprintf("hooks-%d", i)
			var out struct {
				errorBody
				ID string `json:"id"`
			}
			code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
				"task_id": task, "agent_type": tt.agentType, "workspace_path": r.workspace(t), "env": env}, &out)
			if code == http.StatusOK {
				// Let the agent run, to say whether the hook did.
				deadline := time.Now().Add(time.Minute)
				for st := r.Status(t, out.ID); st.Status == "starting" || st.Status == "running"; st = r.Status(t, out.ID) {
					if _, err := os.Stat(marker); err == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				_, err := os.Stat(marker)
				t.Fatalf("the launch was accepted (the hook ran: %v)", err == nil)
			}
			if code != http.StatusBadRequest || out.Error != "validation_error" || !strings.Contains(out.Message, tt.named) {
				t.Fatalf("got %d %+v, want 400 validation_error naming %s", code, out.errorBody, tt.named)
			}
			var nf errorBody
			if code := r.Do(t, "GET", "/api/v1/tasks/"+task, nil, &nf); code != http.StatusNotFound {
				t.Errorf("a refused launch created task %s: %d %+v", task, code, nf)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the hook ran")
			}
		})
	}
	t.Run("listed", func(t *testing.T) {
		var out struct {
			AgentTypes []struct {
				ID        string   `json:"id"`
				LaunchEnv []string `json:"launch_env"`
			} `json:"agent_types"`
		}
		if code := r.Do(t, "GET", "/api/v1/agent-types", nil, &out); code != http.StatusOK {
			t.Fatalf("HTTP %d", code)
		}
		for _, a := range out.AgentTypes {
			if a.ID == "hook-acp" {
				if got := "[" + strings.Join(a.LaunchEnv, ", ") + "]"; got != hookLaunchEnv {
					t.Errorf("hook-acp's launch_env %s, want %s", got, hookLaunchEnv)
				}
				return
			}
		}
		t.Errorf("no hook-acp in %+v", out.AgentTypes)
	})
	t.Run("allowed", func(t *testing.T) {
		in := r.Launch(t, "hook-acp", r.workspace(t), map[string]string{"CALLER_GREETING": "hello", "TASK_DESCRIPTION": "go"})
		r.WaitLogWithin(t, in.ID, "acp-agent: env CALLER_GREETING=hello", time.Minute)
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
			t.Errorf("the allowed launch: %+v", st)
		}
	})
}

// shellHook writes a script that leaves marker behind, for BASH_ENV.
func shellHook(t *testing.T, dir, marker string) string {
	t.Helper()
	path := filepath.Join(dir, "hook.sh")
	if err := os.WriteFile(path, []byte(": > '"+marker+"'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// preloadHook builds a shared library that leaves marker behind when it is
// loaded, for LD_PRELOAD. Without a C compiler it names a library that is
// not there: the launch must be refused all the same.
func preloadHook(t *testing.T, dir, marker string) string {
	t.Helper()
	lib := filepath.Join(dir, "hook.so")
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Logf("no C compiler (%v): LD_PRELOAD names a library that is not there", err)
		return lib
	}
	src := filepath.Join(dir, "hook.c")
	code := fmt.Sprintf("#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void hook(void) { int fd = open(%q, O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd); }\n", marker)
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("building the LD_PRELOAD hook: %v\n%s", err, out)
	}
	return lib
}
