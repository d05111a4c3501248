package executor

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

func TestConfineWorkspaceName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		path, want string
	}{
		{"/workspace/task-1", "/workspace/task-1"},
		{"/workspace", "/workspace"},
		{"/workspace/a//b/", "/workspace/a/b"},
		{"/workspace/../etc", ""},
		{"/workspaces", ""},
		{"/etc", ""},
		{"workspace/a", ""},
		{"", ""},
	} {
		got, err := ConfineWorkspaceName([]string{"/workspace", "/srv/ws/"}, tt.path)
		if got != tt.want || (err == nil) != (tt.want != "") {
			t.Errorf("ConfineWorkspaceName(%q) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
		if err != nil && !errors.Is(err, ErrWorkspace) {
			t.Errorf("%q: error %v does not wrap ErrWorkspace", tt.path, err)
		}
	}
}

func TestConfineWorkspace(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	outside := t.TempDir()
	inside := filepath.Join(root, "ws")
	if err := os.Mkdir(inside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(inside, filepath.Join(outside, "back-in")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path string
		ok   bool
	}{
		{inside, true},
		{root, true},
		{filepath.Join(outside, "back-in"), true}, // resolves inside
		{outside, false},
		{filepath.Join(root, "escape"), false},
		{inside + "/../ws", false},
		{"ws", false},
		{"", false},
		{file, false},
		{filepath.Join(root, "missing"), false},
	} {
		got, err := ConfineWorkspace([]string{root}, tt.path)
		if (err == nil) != tt.ok {
			t.Errorf("ConfineWorkspace(%q) = %q, %v; want ok %v", tt.path, got, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrWorkspace) {
			t.Errorf("%q: error %v does not wrap ErrWorkspace", tt.path, err)
		}
	}
}

// The agent gets exactly the declared environment, runs in the workspace,
// and Kill ends its whole process group, children included.
func TestLocalProcessGroupAndEnv(t *testing.T) {
	// Not parallel: it sets a variable in the runner's own environment.
	ws := t.TempDir()
	typ := agenttype.Type{ID: "sh", Command: []string{"sh", "-c", `env > env.txt; sleep 300 & echo $! > child.pid; wait`}, Enabled: true,
		Env: map[string]string{"DECLARED": "yes"}}
	t.Setenv("RUNNER_SECRET", "must-not-leak")
	p, err := (&Local{Roots: []string{ws}}).Start(context.Background(), Spec{InstanceID: "i", Type: typ, Workspace: ws,
		Env: map[string]string{"DECLARED": "yes", "TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var childPID int
	for childPID == 0 {
		data, _ := os.ReadFile(filepath.Join(ws, "child.pid"))
		childPID, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	}
	env, err := os.ReadFile(filepath.Join(ws, "env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(env)), "\n") {
		k, _, _ := strings.Cut(line, "=")
		switch k {
		case "DECLARED", "TRACEPARENT", "PWD", "SHLVL", "_":
			// Ours, and what sh sets for itself.
		default:
			t.Errorf("the agent got %s, which was not declared", line)
		}
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Wait()
	// The child was in the group: it is gone (or a zombie reaped by init).
	for syscall.Kill(childPID, 0) == nil {
		data, _ := os.ReadFile("/proc/" + strconv.Itoa(childPID) + "/stat")
		if fields := strings.Fields(string(data)); len(fields) > 2 && fields[2] == "Z" {
			break
		}
	}
	if err := p.Kill(); err != nil {
		t.Errorf("a second Kill: %v", err)
	}
}
