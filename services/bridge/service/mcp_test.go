package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bridge/service"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// resultJSON is a tool result's structured content, decoded.
func resultJSON(t testing.TB, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	if len(res.Content) != 1 {
		t.Fatalf("content has %d items, want 1", len(res.Content))
	}
	var text map[string]any
	if err := json.Unmarshal([]byte(testenv.As[*mcp.TextContent](t, res.Content[0], "the text content").Text), &text); err != nil {
		t.Fatalf("text content is not the JSON response: %v", err)
	}
	return m
}

// The stdio server, as Gemini CLI and Claude Code run it: the Go SDK's
// client starts `bridge mcp` and talks over its pipes.
func TestStdio(t *testing.T) {
	t.Parallel()
	cfg := workspace(t)
	var stderr bytes.Buffer
	cmd := exec.Command(bridgeBin, "mcp", "--bridge-config", cfg)
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v := cs.InitializeResult().ProtocolVersion; v == "" || cs.InitializeResult().ServerInfo.Name != "conclave-bridge" {
		t.Fatalf("initialize result %+v", cs.InitializeResult())
	}
	checkTools(t, cs)
	// The failing agent logs to stderr: that must reach the bridge's log,
	// and stdout must still carry only frames (the client would fail on
	// anything else).
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "always_fails", Arguments: map[string]any{"reason": "on purpose"}})
	if err != nil || !res.IsError {
		t.Fatalf("always_fails: %+v %v", res, err)
	}
	if got := testenv.At[string](t, resultJSON(t, res), "error"); !strings.Contains(got, "Unexpected error: on purpose") {
		t.Fatalf("always_fails error = %q", got)
	}
	// Closing the client's pipe ends the server cleanly.
	if err := cs.Close(); err != nil {
		t.Fatalf("close: %v\n%s", err, stderr.String())
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Fatalf("bridge mcp did not exit cleanly: %v\n%s", cmd.ProcessState, stderr.String())
	}
	if !strings.Contains(stderr.String(), "giving up: on purpose") {
		t.Fatalf("agent stderr not in the bridge log:\n%s", stderr.String())
	}
}

// Raw stdio against the real binary: stdout carries nothing but frames; a
// line that is not JSON gets the JSON-RPC parse error (-32700) and one that
// is JSON but not a JSON-RPC message invalid request (-32600), and the
// session goes on serving the next calls.
func TestStdioBadJSONAndCleanStdout(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(bridgeBin, "mcp", "--bridge-config", workspace(t))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdoutPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(stdoutPipe)
	send := func(s string) {
		if _, err := io.WriteString(stdin, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	frame := func() map[string]any {
		line, err := out.ReadBytes('\n')
		if err != nil {
			t.Fatalf("reading a frame: %v\nstderr:\n%s", err, stderr.String())
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil || m["jsonrpc"] != "2.0" {
			t.Fatalf("stdout line is not a JSON-RPC frame: %q", line)
		}
		return m
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if m := frame(); m["id"] != float64(1) || testenv.At[map[string]any](t, m, "result")["protocolVersion"] != "2025-06-18" {
		t.Fatalf("initialize answered %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	// The failing agent writes to stderr; none of it may reach stdout.
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"always_fails","arguments":{}}}`)
	if m := frame(); m["id"] != float64(2) || testenv.At[map[string]any](t, m, "result")["isError"] != true {
		t.Fatalf("tools/call answered %v", m)
	}
	bad := []struct {
		line string
		code float64
		id   any
	}{
		{"this is not json", -32700, nil},
		{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo"`, -32700, nil},
		{`{"jsonrpc":"1.0","id":4,"method":"tools/list"}`, -32600, float64(4)},
		{`[]`, -32600, nil},
	}
	for i, b := range bad {
		send(b.line)
		m := frame()
		e, _ := m["error"].(map[string]any)
		if e == nil || e["code"] != b.code || m["id"] != b.id {
			t.Errorf("%q answered %v, want error %v with id %v", b.line, m, b.code, b.id)
		}
		// The session goes on: the next call is served.
		id := float64(10 + i)
		send(`{"jsonrpc":"2.0","id":` + strconv.Itoa(int(id)) + `,"method":"tools/call","params":{"name":"echo","arguments":{"query":"after"}}}`)
		if m := frame(); m["id"] != id || m["result"] == nil || testenv.At[map[string]any](t, m, "result")["isError"] == true {
			t.Fatalf("call after %q answered %v", b.line, m)
		}
	}
	stdin.Close()
	rest, _ := io.ReadAll(out)
	if len(bytes.TrimSpace(rest)) > 0 {
		t.Errorf("frames after the last answer: %q", rest)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("bridge mcp exit: %v, stderr:\n%s", err, stderr.String())
	}
}

// checkTools lists and calls tools through cs.
func checkTools(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	ctx := context.Background()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
		schema, _ := json.Marshal(tool.InputSchema)
		if !strings.Contains(string(schema), `"type":"object"`) {
			t.Errorf("tool %s has input schema %s", tool.Name, schema)
		}
	}
	for _, want := range []string{"label_github_issue", "triage_cli", "watch_collect", "always_fails", "health_check"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list lacks %s: %v", want, names)
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "label_github_issue", Arguments: map[string]any{"repo_name": "facebook/react", "issue_number": 42}})
	if err != nil || res.IsError {
		t.Fatalf("label_github_issue: %+v %v", res, err)
	}
	got := resultJSON(t, res)
	data := testenv.At[map[string]any](t, got, "data")
	if got["status"] != "success" || data["repo_name"] != "facebook/react" || data["issue_number"] != float64(42) {
		t.Fatalf("label_github_issue = %v", got)
	}
	// CLI-only agent: gets its parameters from the arguments.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "triage_cli", Arguments: map[string]any{"repo_name": "a/b", "issue_number": 7, "dry_run": true}})
	if err != nil || res.IsError {
		t.Fatalf("triage_cli: %+v %v", res, err)
	}
	if r := testenv.At[map[string]any](t, resultJSON(t, res), "result"); r["repo"] != "a/b" || r["issue"] != float64(7) || r["dry_run"] != true {
		t.Fatalf("triage_cli = %v", r)
	}
	// Hybrid agent: the CLI argument wins, and it came from the arguments.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "watch_collect", Arguments: map[string]any{"repo_name": "a/b", "sources": []string{"npm", "pypi"}}})
	if err != nil || res.IsError {
		t.Fatalf("watch_collect: %+v %v", res, err)
	}
	if d := testenv.At[map[string]any](t, resultJSON(t, res), "data"); d["repo_from"] != "cli" || len(testenv.At[map[string]any](t, d, "mentions")) != 2 {
		t.Fatalf("watch_collect = %v", d)
	}
	// Validation failure: an error result in the ADK bridge's form.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "label_github_issue", Arguments: map[string]any{"repo_name": "not a repo", "issue_number": 1}})
	if err != nil || !res.IsError {
		t.Fatalf("invalid repo_name: %+v %v", res, err)
	}
	if e := testenv.At[string](t, resultJSON(t, res), "error"); !strings.HasPrefix(e, "Validation error: Invalid repo_name format") {
		t.Fatalf("invalid repo_name error = %q", e)
	}
	// Unknown tool: a JSON-RPC error.
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Fatalf("unknown tool: %v", err)
	}
	// health_check: the missing agent of the test config is reported.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "health_check", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	h := testenv.At[map[string]any](t, resultJSON(t, res), "data", "agents")
	if testenv.At[map[string]any](t, h, "label_github_issue")["healthy"] != true || testenv.At[map[string]any](t, h, "missing")["healthy"] != false || !res.IsError {
		t.Fatalf("health_check = %v", h)
	}
}

func TestStreamableHTTP(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	checkTools(t, connectHTTP(t, b, nil))
}

func TestHTTPAuthentication(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	for _, tt := range []struct {
		name, auth string
		// host is the request's Host, as a relay to the loopback
		// listener leaves it ("" for the listener's own).
		host string
		want int
	}{
		{"no token", "", "", http.StatusUnauthorized},
		{"wrong token", "Bearer nope", "", http.StatusUnauthorized},
		{"not bearer", "Basic " + testToken, "", http.StatusUnauthorized},
		{"valid", "Bearer " + testToken, "", http.StatusOK},
		// With tokens, a client through a relay (an agent in a pod) is
		// answered under the relay's name: a rebound page has no token.
		{"valid, through a relay", "Bearer " + testToken, "10.250.0.1:44295", http.StatusOK},
		{"no token, through a relay", "", "10.250.0.1:44295", http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest(http.MethodPost, b.url, strings.NewReader(init))
		if tt.host != "" {
			req.Host = tt.host
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		resp, body := testenv.Do(t, req)
		if resp.StatusCode != tt.want {
			t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.want, body)
		}
		if tt.want == http.StatusUnauthorized {
			decodeRPCError(t, body, -32600)
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s: 401 without WWW-Authenticate", tt.name)
			}
		}
	}
}

func TestHTTPUnauthenticatedWhenAllowed(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, func(c *serviceConfig) { c.Tokens, c.AllowUnauthenticated = nil, true })
	client := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: b.url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}

func TestHTTPRateLimit(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, func(c *serviceConfig) { c.Rate, c.Burst = 0.001, 2 })
	codes := map[int]int{}
	for range 4 {
		req, _ := http.NewRequest(http.MethodPost, b.url, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[http.StatusTooManyRequests] != 2 {
		t.Fatalf("status codes %v, want 2 of them 429", codes)
	}
}

// decodeRPCError checks that body is the bridge's one HTTP error shape, a
// JSON-RPC error response without an id, with the given code.
func decodeRPCError(t *testing.T, body []byte, code int) {
	t.Helper()
	var e struct {
		JSONRPC string `json:"jsonrpc"`
		ID      any    `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.JSONRPC != "2.0" || e.ID != nil || e.Error.Code != code || e.Error.Message == "" {
		t.Errorf("not a JSON-RPC error with code %d (%v): %.300s", code, err, body)
	}
}

// TestHTTPBadRequests: every error of the bridge's HTTP port, the MCP
// SDK's transport errors and the server's own included, is a JSON-RPC
// error response, never plain text.
func TestHTTPBadRequests(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, func(c *serviceConfig) { c.MaxRequestBytes = 64 << 10 })
	base := strings.TrimSuffix(b.url, service.MCPPath)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	for _, tt := range []struct {
		name, method, url, body, contentType, accept string
		header                                       map[string]string
		status                                       int
		allow                                        string
	}{
		{"bad JSON", "POST", b.url, `{"jsonrpc":"2.0","id":1,"method":`, "application/json", "application/json, text/event-stream", nil, http.StatusBadRequest, ""},
		{"oversized body", "POST", b.url, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"` + strings.Repeat("a", 128<<10) + `"}}`, "application/json", "application/json, text/event-stream", nil, http.StatusRequestEntityTooLarge, ""},
		{"wrong Content-Type", "POST", b.url, init, "text/plain", "application/json, text/event-stream", nil, http.StatusUnsupportedMediaType, ""},
		{"wrong Accept", "POST", b.url, init, "application/json", "text/html", nil, http.StatusBadRequest, ""},
		{"unknown session", "POST", b.url, init, "application/json", "application/json, text/event-stream", map[string]string{"Mcp-Session-Id": "nope"}, http.StatusNotFound, ""},
		{"wrong method", "PUT", b.url, init, "application/json", "application/json, text/event-stream", nil, http.StatusMethodNotAllowed, "GET, POST, DELETE"},
		{"unknown path", "GET", base + "/nope", "", "", "", nil, http.StatusNotFound, ""},
		{"wrong method on a built-in route", "POST", base + "/healthz", "{}", "application/json", "", nil, http.StatusMethodNotAllowed, "GET, HEAD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, tt.url, strings.NewReader(tt.body))
			req.Header.Set("Authorization", "Bearer "+testToken)
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			if tt.accept != "" {
				req.Header.Set("Accept", tt.accept)
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, out := testenv.Do(t, req)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tt.status, out)
			}
			decodeRPCError(t, out, -32600)
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
		})
	}
}

// Every kind of bad input and misbehaving agent gets a clear error result.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	cs := connectHTTP(t, b, nil)
	tests := []struct {
		name, tool string
		args       any
		want       string
	}{
		{"wrong type", "label_github_issue", map[string]any{"repo_name": "a/b", "issue_number": "twelve"}, "Validation error: Invalid issue_number"},
		{"schema type", "label_github_issue", map[string]any{"repo_name": "a/b", "issue_number": 1, "dry_run": "yes"}, "Validation error: parameters do not match label_github_issue's schema"},
		{"missing required", "label_github_issue", map[string]any{"repo_name": "a/b"}, "Validation error: parameters do not match"},
		{"issue out of range", "label_github_issue", map[string]any{"repo_name": "a/b", "issue_number": 1000000000}, "Validation error: Invalid issue_number: 1000000000 is out of range"},
		{"bad source", "watch_collect", map[string]any{"repo_name": "a/b", "sources": []string{"gitlab"}}, `Validation error: Invalid sources: item 0 is "gitlab"`},
		{"one megabyte string", "echo", map[string]any{"query": strings.Repeat("a", 1<<20)}, "Validation error: parameter query is 1048576 characters long"},
		{"arguments not an object", "echo", []int{1, 2}, "Validation error: parameters must be a JSON object"},
		{"100 MB of output", "flood", map[string]any{}, "Output too large: flood wrote more than 1048576 bytes"},
		{"never exits", "hang", map[string]any{}, "Timeout: hang did not finish within its timeout of 2s"},
		{"debug print", "debug_print", map[string]any{}, "Invalid JSON: the agent printed text to stdout before its JSON object"},
		{"missing script", "missing", map[string]any{}, "Agent not found: script"},
		{"agent failure", "always_fails", map[string]any{}, "Execution error: always_fails exited with code 1: Unexpected error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tt.tool, Arguments: tt.args})
			if err != nil {
				t.Fatal(err)
			}
			got := resultJSON(t, res)
			if !res.IsError || got["status"] != "error" || !strings.HasPrefix(testenv.At[string](t, got, "error"), tt.want) {
				t.Fatalf("%s: %v, want an error starting %q", tt.tool, got, tt.want)
			}
		})
	}
}

// Shell metacharacters reach the agent as literals, on its command line and
// on stdin, and nothing a shell would do with them happens.
func TestMetacharactersAreLiteral(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	cs := connectHTTP(t, b, nil)
	marker := filepath.Join(b.dir, "pwned")
	evil := "; touch " + marker + " && $(touch " + marker + ") `touch " + marker + "` | tee " + marker + " > " + marker + " *"
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"query": evil}})
	if err != nil || res.IsError {
		t.Fatalf("echo: %+v %v", res, err)
	}
	data := testenv.At[map[string]any](t, resultJSON(t, res), "data")
	if argv := testenv.At[[]any](t, data, "argv"); len(argv) != 1 || argv[0] != "--query="+evil {
		t.Fatalf("argv = %q", argv)
	}
	if testenv.At[map[string]any](t, data, "params")["query"] != evil {
		t.Fatalf("stdin params = %v", data["params"])
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a metacharacter was interpreted: %s exists", marker)
	}
}

func TestGrandchildIsKilledWithTheGroup(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	cs := connectHTTP(t, b, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "grandchild", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("grandchild: %+v %v", res, err)
	}
	waitGone(t, int(testenv.At[float64](t, resultJSON(t, res), "data")))
}

// A client that gives up on a call (cancels it, or drops its connection)
// gets the agent and its children killed.
func TestCancelledCallKillsAgent(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	cs := connectHTTP(t, b, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hang_with_child", Arguments: map[string]any{}})
		done <- err
	}()
	pidFile := filepath.Join(b.dir, "hang_child.pid")
	pid := readPID(t, pidFile)
	if pid == 0 {
		t.Fatal("the agent never started its child")
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled call returned no error")
	}
	waitGone(t, pid)
}

// readPID waits for an agent to write its pid file.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	testenv.EventuallyNoError(t, time.Minute, "a pid in "+path, func() error {
		raw, err := os.ReadFile(path)
		if err == nil {
			pid, err = strconv.Atoi(strings.TrimSpace(string(raw)))
		}
		return err
	})
	return pid
}

// A bridge killed with SIGKILL takes its running agents with it.
func TestKilledBridgeKillsAgents(t *testing.T) {
	t.Parallel()
	cfg := workspace(t)
	cmd := exec.Command(bridgeBin, "mcp", "--bridge-config", cfg)
	client := mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	go func() {
		_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hang_with_child", Arguments: map[string]any{}})
	}()
	dir := filepath.Dir(cfg)
	agent := readPID(t, filepath.Join(dir, "hang_agent.pid"))
	child := readPID(t, filepath.Join(dir, "hang_child.pid"))
	// The agent's own child is out of a dead bridge's reach (docs/bridge.md).
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, agent)
}

// A stdio client that has closed its input still gets its calls answered;
// SIGTERM, which MCP clients send a server that does not exit, stops the
// bridge at once and takes the running agents down.
func TestStdioSIGTERMCancelsCalls(t *testing.T) {
	t.Parallel()
	cfg := workspace(t)
	cmd := exec.Command(bridgeBin, "mcp", "--bridge-config", cfg)
	cmd.Stdin = strings.NewReader(strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"hang_with_child","arguments":{}}}`,
	}, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	dir := filepath.Dir(cfg)
	agent := readPID(t, filepath.Join(dir, "hang_agent.pid"))
	child := readPID(t, filepath.Join(dir, "hang_child.pid"))
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	select {
	case err := <-exited:
		t.Fatalf("bridge mcp exited with a call in flight: %v\n%s", err, stderr.String())
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("bridge mcp did not exit on SIGTERM\n%s", stderr.String())
	}
	waitGone(t, agent)
	waitGone(t, child)
}

// waitGone waits until pid no longer runs (a zombie no init reaps counts as
// gone).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("process %d to end", pid), func() bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
	})
}

func TestProgressNotifications(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	var progress atomic.Int32
	var last atomic.Value
	cs := connectHTTP(t, b, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		progress.Add(1)
		last.Store(req.Params.Message)
	}})
	params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{}}
	params.SetProgressToken("slow-call")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("slow: %+v %v", res, err)
	}
	if progress.Load() == 0 {
		t.Fatal("no progress notification during a 1.5 s call with a 100 ms interval")
	}
	if msg, _ := last.Load().(string); !strings.Contains(msg, "slow running for") {
		t.Fatalf("progress message %q", msg)
	}
}

type serviceConfig = service.Config

// The SDK negotiates the version: a supported one is echoed, an unknown one
// gets the server's own latest, never a fixed one.
func TestProtocolVersionNegotiated(t *testing.T) {
	t.Parallel()
	cfg := workspace(t)
	for _, tt := range []struct{ asked, wantPrefix string }{
		{"2025-03-26", "2025-03-26"},
		{"2025-06-18", "2025-06-18"},
		{"1999-01-01", "20"},
	} {
		cmd := exec.Command(bridgeBin, "mcp", "--bridge-config", cfg)
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Closing stdin at once is fine: the answer still comes.
		_, _ = io.WriteString(stdin, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"`+tt.asked+`","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`+"\n")
		stdin.Close()
		line, err := bufio.NewReader(stdout).ReadBytes('\n')
		if werr := cmd.Wait(); err != nil || werr != nil {
			t.Fatalf("bridge mcp: %v, exit %v", err, werr)
		}
		var resp struct {
			Result struct{ ProtocolVersion string }
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		got := resp.Result.ProtocolVersion
		if !strings.HasPrefix(got, tt.wantPrefix) || (tt.asked == "1999-01-01" && got == tt.asked) {
			t.Errorf("asked %s, got %q", tt.asked, got)
		}
	}
}

// Beyond CONCLAVE_BRIDGE_MAX_RUNNING agents at once, calls are refused at
// once with a Busy error, and run again when a slot is free.
func TestBusy(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, func(c *serviceConfig) { c.MaxRunning = 1 })
	cs := connectHTTP(t, b, nil)
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{}})
	}()
	for metricsValue(t, b, "conclave_bridge_agents_running") != 1 {
		select {
		case <-done:
			t.Fatal("the slow call ended before it was seen running")
		default:
		}
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.HasPrefix(testenv.At[string](t, resultJSON(t, res), "error"), "Busy: 1 agents are running already") {
		t.Fatalf("second call while one runs: %+v %v", res, err)
	}
	<-done
	if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil || res.IsError {
		t.Fatalf("call after the slot freed: %+v %v", res, err)
	}
}

// On shutdown (SIGTERM) a tool call already running is drained: it finishes
// and its result reaches the client, while a call made once the drain has
// begun is refused.
func TestShutdownDrainsToolCalls(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	// The running call's client reconnects its event stream as real clients
	// do (the SDK's default retries): a strict client, which fails its
	// session as soon as the server ends that stream, could see the end
	// before the result that the server sent first on the call's own stream.
	client := mcp.NewClient(&mcp.Implementation{Name: "bridge-test", Version: "1"}, nil)
	running, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   b.url,
		HTTPClient: &http.Client{Transport: testenv.Bearer{Token: testToken, Next: http.DefaultTransport}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Close() })
	latecomer := connectHTTP(t, b, nil)
	type callResult struct {
		res *mcp.CallToolResult
		err error
	}
	result := make(chan callResult, 1)
	go func() {
		res, err := running.CallTool(context.Background(), &mcp.CallToolParams{Name: "gated", Arguments: map[string]any{}})
		result <- callResult{res, err}
	}()
	waitFile(t, filepath.Join(b.dir, "gated.started"))

	stopped := make(chan error, 1)
	go func() { stopped <- b.shutdown() }()
	testenv.AwaitRefused(t, strings.TrimPrefix(b.base, "http://"))
	if res, err := latecomer.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err == nil {
		t.Errorf("a call made during the drain ran: %+v", res)
	}

	if err := os.WriteFile(filepath.Join(b.dir, "gated.release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := <-result
	if r.err != nil || r.res.IsError {
		t.Fatalf("the call running at shutdown = %+v, %v; want its result", r.res, r.err)
	}
	if got := resultJSON(t, r.res); got["status"] != "success" || got["data"] != "released" {
		t.Errorf("the call running at shutdown = %v", got)
	}
	if err := <-stopped; err != nil {
		t.Errorf("bridge Run = %v, want a clean drain", err)
	}
}

// A call still running when the drain deadline passes is cancelled: its
// agent and the agent's children are killed, none outlives the bridge.
func TestShutdownDeadlineKillsAgents(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, func(c *service.Config) { c.ShutdownTimeout = 200 * time.Millisecond })
	cs := connectHTTP(t, b, nil)
	go func() {
		_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hang_with_child", Arguments: map[string]any{}})
	}()
	agent := readPID(t, filepath.Join(b.dir, "hang_agent.pid"))
	child := readPID(t, filepath.Join(b.dir, "hang_child.pid"))
	if err := b.shutdown(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("bridge Run = %v, want the drain deadline", err)
	}
	waitGone(t, agent)
	waitGone(t, child)
}

// waitFile waits for an agent to create path.
func waitFile(t *testing.T, path string) {
	t.Helper()
	testenv.EventuallyNoError(t, time.Minute, path+" to appear", func() error {
		_, err := os.Stat(path)
		return err
	})
}
