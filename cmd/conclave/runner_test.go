package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestDevServesRunner runs conclave dev with the example ACP agent as an
// agent type and drives it with `conclave runner`: types, launch, status, list,
// logs --follow until the launch ends, prompt, cancel, delete.
func TestDevServesRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary and an agent")
	}
	t.Parallel()
	dir := t.TempDir()
	types, ws := exampleAgentType(t, dir, "")
	_, addrs, stderr := devProcess(t, filepath.Join(dir, "data"), "--runner-agent-types="+types, "--runner-workspace-roots="+dir,
		"--runner-idle-timeout=1ms")
	addr := addrs["runner HTTP"]
	if addr == "" || addrs["runner gRPC"] == "" {
		t.Fatalf("no runner rows in the endpoint table: %v\n%s", addrs, stderr)
	}
	env := map[string]string{"CONCLAVE_RUNNER_URL": "http://" + addr}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := runRunner(context.Background(), args, lookup, &out, &errOut)
		return out.String(), err
	}
	if out, err := run("types"); err != nil || !strings.Contains(out, `"example"`) || !strings.Contains(out, `"augment-agent"`) {
		t.Fatalf("types: %s %v", out, err)
	}
	if _, err := run("launch", "--type", "nope", "--workspace", ws); err == nil || !strings.Contains(err.Error(), "validation_error") {
		t.Fatalf("launch of an unknown type: %v", err)
	}
	out, err := run("launch", "--type", "example", "--workspace", ws, "--prompt", "write the notes", "--task", "cli-task")
	if err != nil {
		t.Fatalf("launch: %s %v", out, err)
	}
	var in struct{ ID, Status string }
	if err := json.Unmarshal([]byte(out), &in); err != nil || in.Status != "starting" {
		t.Fatalf("launch printed %s (%v)", out, err)
	}
	// --follow returns when the launch ends: after the turn, as the idle
	// timeout is 1ms.
	logs, err := run("logs", in.ID, "--follow", "--tail", "1000")
	if err != nil {
		t.Fatalf("logs --follow: %v", err)
	}
	for _, want := range []string{"content: Working on: write the notes", "status: completed", "idle for"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs --follow lack %q:\n%s", want, logs)
		}
	}
	if out, err := run("status", in.ID); err != nil || !strings.Contains(out, `"completed"`) {
		t.Fatalf("status: %s %v", out, err)
	}
	if out, err := run("prompt", in.ID, "and again"); err != nil || !strings.Contains(out, `"accepted": true`) {
		t.Fatalf("prompt: %s %v", out, err)
	}
	if out, err := run("logs", in.ID, "--follow"); err != nil || !strings.Contains(out, "Working on: and again") {
		t.Fatalf("logs after the prompt: %s %v", out, err)
	}
	if out, err := run("cancel", in.ID); err != nil || !strings.Contains(out, in.ID) {
		t.Fatalf("cancel: %s %v", out, err)
	}
	if out, err := run("list", "--type", "example", "--page-size", "5"); err != nil || !strings.Contains(out, `"id": "`+in.ID+`"`) || !strings.Contains(out, `"next_page_token": ""`) {
		t.Fatalf("list: %s %v", out, err)
	}
	if _, err := run("list", "--page-token", "garbage"); err == nil || !strings.Contains(err.Error(), "400 validation_error") {
		t.Fatalf("list with a bad page token: %v", err)
	}
	if out, err := run("delete", in.ID); err != nil || !strings.Contains(out, `"deleted": true`) {
		t.Fatalf("delete: %s %v", out, err)
	}
	if _, err := run("status", in.ID); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("status after delete: %v", err)
	}
	if out, err := run("list"); err != nil || strings.Contains(out, in.ID) {
		t.Fatalf("list after delete: %s %v", out, err)
	}
}

// TestDevRunnerAgentsOnTheGateway: in conclave dev, an agent type with
// gateway: true is registered by the runner at dev's own gateway, and
// `conclave agent list` and `conclave agent send` reach it as they reach
// an agent that dials in itself.
func TestDevRunnerAgentsOnTheGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary and an agent")
	}
	t.Parallel()
	dir := t.TempDir()
	types, ws := exampleAgentType(t, dir, "    name: the example agent\n    gateway: true\n    capabilities: [chat, notes]\n")
	_, addrs, stderr := devProcess(t, filepath.Join(dir, "data"), "--runner-agent-types="+types, "--runner-workspace-roots="+dir)
	env := map[string]string{"CONCLAVE_RUNNER_URL": "http://" + addrs["runner HTTP"]}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var out, errOut bytes.Buffer
	if err := runRunner(context.Background(), []string{"launch", "--type", "example", "--workspace", ws, "--task", "gw-task"}, lookup, &out, &errOut); err != nil {
		t.Fatalf("launch: %v %s", err, errOut.String())
	}
	var in struct{ ID string }
	if err := json.Unmarshal(out.Bytes(), &in); err != nil {
		t.Fatal(err)
	}
	gateway := addrs["gateway gRPC"]
	var list bytes.Buffer
	testenv.EventuallyNoError(t, time.Minute, "the runner's agent in 'conclave agent list'", func() error {
		list.Reset()
		err := runAgent(context.Background(), []string{"list", "--addr", gateway}, &list, io.Discard)
		if err == nil && !strings.Contains(list.String(), in.ID) {
			err = fmt.Errorf("not listed")
		}
		if err != nil {
			return fmt.Errorf("%w\n%s\n%s", err, list.String(), stderr)
		}
		return nil
	})
	if !strings.Contains(list.String(), "the example agent") || !strings.Contains(list.String(), "chat,notes") || !strings.Contains(list.String(), "runner:dev") {
		t.Errorf("list:\n%s", list.String())
	}
	var reply, replyErr bytes.Buffer
	if err := runAgent(context.Background(), []string{"send", "--agent", in.ID, "--addr", gateway, "write", "the", "notes"}, &reply, &replyErr); err != nil {
		t.Fatalf("send: %v\n%s", err, replyErr.String())
	}
	for _, want := range []string{"Working on: write the notes", "[tool] write notes.txt"} {
		if !strings.Contains(reply.String(), want) {
			t.Errorf("the reply lacks %q:\n%s", want, reply.String())
		}
	}
	if b, err := os.ReadFile(filepath.Join(ws, "notes.txt")); err != nil || !strings.Contains(string(b), "write the notes") {
		t.Errorf("notes.txt: %q %v", b, err)
	}
}

// exampleAgentType registers examples/acp-agent (built by TestMain beside
// conclave) as the agent type "example" in dir/types.yaml, with extra
// (YAML members of the type) added; it returns that file and a workspace
// under dir.
func exampleAgentType(t *testing.T, dir, extra string) (types, ws string) {
	t.Helper()
	agent := filepath.Join(filepath.Dir(conclaveBin), exampleAgentBinary)
	types = filepath.Join(dir, "types.yaml")
	if err := os.WriteFile(types, fmt.Appendf(nil, "agent_types:\n  - id: example\n    command: [%q]\n    permission: allow\n    enabled: true\n%s", agent, extra), 0o644); err != nil {
		t.Fatal(err)
	}
	ws = filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return types, ws
}
