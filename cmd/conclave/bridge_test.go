package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

func TestDevServesBridge(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary")
	}
	t.Parallel()
	_, addrs, stderr := devProcess(t, t.TempDir())
	addr := addrs["bridge HTTP"]
	if addr == "" {
		t.Fatalf("no bridge row in the endpoint table: %v\n%s", addrs, stderr)
	}
	// conclave dev opens the MCP endpoint without a token, on loopback.
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, body := testenv.Do(t, req)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"conclave-bridge"`) {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
}

func TestBridgeCommands(t *testing.T) {
	t.Parallel()
	cfg := "--bridge-config=../../examples/tool-agents/config.yaml"
	tests := []struct {
		args    []string
		wantOut string
		wantErr bool
	}{
		{[]string{"bridge", "list", cfg}, "label_github_issue", false},
		{[]string{"bridge", "health", cfg}, `"healthy": true`, false},
		{[]string{"bridge", "diagnose", cfg}, "no problems found", false},
		{[]string{"bridge", "run", "label_github_issue", `{"repo_name":"a/b","issue_number":2}`, cfg}, `"labels": ["triage", "bug"]`, false},
		{[]string{"bridge", "run", "label_github_issue", `{"repo_name":"a b","issue_number":2}`, cfg}, `"error":"Validation error: Invalid repo_name format`, true},
		{[]string{"bridge", "run", "always_fails", cfg}, `Execution error: always_fails exited with code 1`, true},
		{[]string{"bridge", "run", "nope", cfg}, "", true},
		{[]string{"bridge", "list", "--bridge-config=/nonexistent/config.yaml"}, "", true},
		{[]string{"bridge", "launch"}, "", true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:2], " "), func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(conclaveBin, tt.args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if (err != nil) != tt.wantErr || !strings.Contains(stdout.String(), tt.wantOut) {
				t.Fatalf("conclave %v: err %v\nstdout %s\nstderr %s", tt.args, err, stdout.String(), stderr.String())
			}
			if tt.wantErr && !strings.Contains(stderr.String(), "conclave:") {
				t.Fatalf("no error line on stderr: %s", stderr.String())
			}
			if tt.args[1] == "run" && stdout.Len() > 0 && !json.Valid(bytes.TrimSpace(stdout.Bytes())) {
				t.Fatalf("run printed non-JSON: %s", stdout.String())
			}
		})
	}
}

// Requests piped into `conclave bridge mcp`, as scripts do (`printf ... |
// conclave bridge mcp`), are all answered: the end of input ends the
// session only once every request read has its answer.
func TestBridgeMCPAnswersPipedRequests(t *testing.T) {
	t.Parallel()
	requests := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"printf","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"label_github_issue","arguments":{"repo_name":"a/b","issue_number":3}}}`,
		`{"jsonrpc":"2.0","id":"four","method":"ping"}`,
	}
	cmd := exec.Command(conclaveBin, "bridge", "mcp", "--bridge-config=../../examples/tool-agents/config.yaml")
	cmd.Stdin = strings.NewReader(strings.Join(requests, "\n") + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("conclave bridge mcp: %v\nstderr:\n%s", err, stderr.String())
	}
	got := map[string]map[string]any{} // id: the result
	for line := range bytes.Lines(stdout.Bytes()) {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Result map[string]any  `json:"result"`
			Error  any             `json:"error"`
		}
		if err := json.Unmarshal(line, &m); err != nil || m.Error != nil || m.Result == nil {
			t.Fatalf("stdout line %q is not a result (%v)", line, err)
		}
		got[string(m.ID)] = m.Result
	}
	if len(got) != 4 {
		t.Fatalf("answered %d of the 4 requests:\n%s\nstderr:\n%s", len(got), stdout.String(), stderr.String())
	}
	if got["1"]["protocolVersion"] != "2025-06-18" {
		t.Errorf("initialize = %v", got["1"])
	}
	if tools, _ := got["2"]["tools"].([]any); len(tools) == 0 {
		t.Errorf("tools/list = %v", got["2"])
	}
	if sc, _ := got["3"]["structuredContent"].(map[string]any); got["3"]["isError"] == true || sc["status"] != "success" {
		t.Errorf("tools/call = %v", got["3"])
	}
	if _, ok := got[`"four"`]; !ok {
		t.Errorf("ping unanswered: %v", got)
	}
}
