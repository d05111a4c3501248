package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// browserRequest sends what a page in the developer's browser can send to
// any origin, or through DNS rebinding under its own name.
func browserRequest(t *testing.T, method, url, host, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	if host != "" {
		req.Host = host
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// A page in the developer's browser cannot drive conclave dev: a "simple"
// cross-origin request (text/plain, a form, a body without a type) to a
// state-changing endpoint of any service is refused with 415 before it
// does anything, and a request under another name than loopback's (DNS
// rebinding) is refused with 403, reads included.
func TestDevRefusesWebPages(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary")
	}
	t.Parallel()
	// An agent type that any launch the test lets through would start.
	dir := t.TempDir()
	types := filepath.Join(dir, "types.yaml")
	if err := os.WriteFile(types, []byte("agent_types:\n  - id: idle\n    command: [/bin/cat]\n    permission: allow\n    enabled: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, addrs, stderr := devProcess(t, filepath.Join(dir, "data"), "--runner-agent-types="+types, "--runner-workspace-roots="+dir)
	url := func(row, path string) string {
		t.Helper()
		a := addrs[row]
		if a == "" {
			t.Fatalf("no %q in the endpoint table %v", row, addrs)
		}
		return "http://" + a + path
	}
	instances := func() int {
		t.Helper()
		status, body := browserRequest(t, "GET", url("runner HTTP", "/api/v1/agents"), "", "", "")
		var list struct {
			Agents []json.RawMessage `json:"agents"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &list) != nil {
			t.Fatalf("runner list: %d %s", status, body)
		}
		return len(list.Agents)
	}
	launch := `{"task_id":"t-1","agent_type":"idle","workspace_path":` + strconv.Quote(dir) + `}`
	// The launch is valid: sent as JSON from loopback, it starts an agent.
	if status, body := browserRequest(t, "POST", url("runner HTTP", "/api/v1/agents/launch"), "", "application/json", launch); status != http.StatusOK {
		t.Fatalf("a valid launch: %d %s", status, body)
	}
	simple := []struct {
		name, row, path, contentType, body string
	}{
		{"gateway message", "gateway HTTP", "/v1/agents/agent-1/messages", "text/plain", `{"content":"hi"}`},
		{"gateway cancel", "gateway HTTP", "/v1/requests/r-1/cancel", "", ""},
		{"runner launch", "runner HTTP", "/api/v1/agents/launch", "text/plain", launch},
		{"runner launch as a Blob", "runner HTTP", "/api/v1/agents/launch", "", launch},
		{"runner launch as a form", "runner HTTP", "/api/v1/agents/launch", "application/x-www-form-urlencoded", "a=b"},
		{"librarian request", "librarian HTTP", "/agent/request", "text/plain", `{"agent_id":"claude-3"}`},
		{"librarian review decision", "librarian HTTP", "/reviews/r-1/decision", "text/plain", `{"decision":"approve","comment":"ok"}`},
		{"librarian review page", "librarian HTTP", "/review/r-1", "text/plain", "decision=approve&comment=ok"},
		{"bus redrive", "bus WebSocket", "/v1/dead-letters/redrive", "text/plain", "x"},
		{"bus redrive without a body", "bus WebSocket", "/v1/dead-letters/redrive", "", ""},
		{"bridge tool call", "bridge HTTP", "/mcp", "text/plain", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}`},
		{"console publish", "console HTTP", "/bus/publish", "text/plain", "topic=x&message=y"},
	}
	before := instances()
	for _, tt := range simple {
		if status, body := browserRequest(t, "POST", url(tt.row, tt.path), "", tt.contentType, tt.body); status != http.StatusUnsupportedMediaType {
			t.Errorf("%s with Content-Type %q: %d %s, want 415", tt.name, tt.contentType, status, body)
		}
	}
	if after := instances(); after != before {
		t.Errorf("the refused launches started %d agents", after-before)
	}

	for _, row := range []string{"gateway HTTP", "runner HTTP", "librarian HTTP", "bus WebSocket", "bridge HTTP", "console HTTP"} {
		for _, path := range []string{"/healthz", "/metrics"} {
			if status, body := browserRequest(t, "GET", url(row, path), "evil.example", "", ""); status != http.StatusForbidden {
				t.Errorf("%s %s for Host evil.example: %d %.200s, want 403", row, path, status, body)
			}
		}
		if status, _ := browserRequest(t, "GET", url(row, "/healthz"), "localhost:1234", "", ""); status != http.StatusOK {
			t.Errorf("%s /healthz for Host localhost: %d, want 200", row, status)
		}
	}
	// A rebinding page can send JSON: the Host rule alone stops it.
	if status, body := browserRequest(t, "POST", url("runner HTTP", "/api/v1/agents/launch"), "evil.example", "application/json", launch); status != http.StatusForbidden {
		t.Errorf("a JSON launch for Host evil.example: %d %s, want 403", status, body)
	}
	if after := instances(); after != before {
		t.Errorf("a refused launch started an agent")
	}
	if t.Failed() {
		t.Logf("conclave dev's log:\n%s", stderr)
	}
}
