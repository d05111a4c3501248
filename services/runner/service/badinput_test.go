package service_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestBadLaunches: each gets 400 validation_error in the REST error body,
// and
// creates nothing.
func TestBadLaunches(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a runner")
	}
	t.Parallel()
	r := startRunner(t, nil)
	ws := r.workspace(t)
	outside := t.TempDir()
	escape := filepath.Join(ws, "escape")
	if err := os.Symlink(outside, escape); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 70<<10)
	for _, tt := range []struct {
		name    string
		body    map[string]any
		status  int
		code    string
		message string
	}{
		{"unknown agent type", map[string]any{"task_id": "t1", "agent_type": "nope", "workspace_path": ws}, 400, "validation_error", `unknown agent_type "nope"`},
		{"workspace outside the roots", map[string]any{"task_id": "t2", "agent_type": "acp-normal", "workspace_path": outside}, 400, "validation_error", "workspace_path"},
		{"workspace with ..", map[string]any{"task_id": "t3", "agent_type": "acp-normal", "workspace_path": ws + "/../.."}, 400, "validation_error", "workspace_path"},
		{"workspace through a symlink out", map[string]any{"task_id": "t4", "agent_type": "acp-normal", "workspace_path": escape}, 400, "validation_error", "workspace_path"},
		{"relative workspace", map[string]any{"task_id": "t5", "agent_type": "acp-normal", "workspace_path": "ws"}, 400, "validation_error", "workspace_path"},
		{"oversized env", map[string]any{"task_id": "t6", "agent_type": "acp-normal", "workspace_path": ws, "env": map[string]string{"BIG": big}}, 400, "validation_error", "env is"},
		{"bad env name", map[string]any{"task_id": "t7", "agent_type": "acp-normal", "workspace_path": ws, "env": map[string]string{"A=B": "x"}}, 400, "validation_error", "env variable name"},
		{"disabled agent type", map[string]any{"task_id": "t10", "agent_type": "disabled-agent", "workspace_path": ws}, 400, "validation_error", "says enabled: false"},
		{"missing required env", map[string]any{"task_id": "t8", "agent_type": "needs-env", "workspace_path": ws}, 400, "validation_error", "API_KEY"},
		// The built-in augment-agent has an image but no command: the local
		// executor cannot start it, so the launch is refused, not failed
		// after it was accepted.
		{"a type the executor cannot run", map[string]any{"task_id": "t11", "agent_type": "augment-agent", "workspace_path": ws,
			"env": map[string]string{"AUGMENT_SESSION_AUTH": "x", "TASK_DESCRIPTION": "y"}}, 400, "validation_error", "no command, which the local executor runs"},
		{"no task id", map[string]any{"agent_type": "acp-normal", "workspace_path": ws}, 400, "validation_error", "task_id"},
		{"unknown field", map[string]any{"task_id": "t9", "agent_type": "acp-normal", "workspace_path": ws, "bogus": 1}, 400, "bad_request", ""},
		{"gateway not a bool", map[string]any{"task_id": "t11", "agent_type": "acp-normal", "workspace_path": ws, "metadata": map[string]any{"gateway": "yes"}}, 400, "validation_error", "metadata.gateway must be true or false"},
		{"gateway_agent_id not a string", map[string]any{"task_id": "t12", "agent_type": "acp-normal", "workspace_path": ws, "metadata": map[string]any{"gateway": true, "gateway_agent_id": 7}}, 400, "validation_error", "metadata.gateway_agent_id must be a string"},
		{"gateway_agent_id with a space", map[string]any{"task_id": "t13", "agent_type": "acp-normal", "workspace_path": ws, "metadata": map[string]any{"gateway": true, "gateway_agent_id": "two words"}}, 400, "validation_error", "metadata.gateway_agent_id: agent_id"},
		{"gateway_agent_id too long", map[string]any{"task_id": "t14", "agent_type": "acp-normal", "workspace_path": ws, "metadata": map[string]any{"gateway_agent_id": strings.Repeat("a", 129)}}, 400, "validation_error", "metadata.gateway_agent_id: agent_id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var e errorBody
			code := r.Do(t, "POST", "/api/v1/agents/launch", tt.body, &e)
			if code != tt.status || e.Error != tt.code || e.HTTPStatus != tt.status || !strings.Contains(e.Message+" "+e.Details, tt.message) {
				t.Fatalf("got %d %+v, want %d %s mentioning %q", code, e, tt.status, tt.code, tt.message)
			}
			if id, _ := tt.body["task_id"].(string); id != "" {
				var nf errorBody
				if code := r.Do(t, "GET", "/api/v1/tasks/"+id, nil, &nf); code != http.StatusNotFound || nf.Error != "not_found" {
					t.Errorf("a refused launch created task %s: %d %+v", id, code, nf)
				}
			}
		})
	}
	t.Run("unknown instance", func(t *testing.T) {
		for _, p := range []string{"/status", "/logs", "/session"} {
			var e errorBody
			if code := r.Do(t, "GET", "/api/v1/agents/missing"+p, nil, &e); code != 404 || e.Error != "not_found" || e.HTTPStatus != 404 {
				t.Errorf("%s: %d %+v", p, code, e)
			}
		}
		var e errorBody
		if code := r.Do(t, "POST", "/api/v1/agents/missing/prompt", map[string]string{"message": "hi"}, &e); code != 404 {
			t.Errorf("prompt: %d %+v", code, e)
		}
		// HEAD reaches the GET route, not a 405.
		if code := r.Do(t, "HEAD", "/api/v1/agents/missing/status", nil, nil); code != 404 {
			t.Errorf("HEAD status: %d", code)
		}
	})
	t.Run("empty prompt and bad tail", func(t *testing.T) {
		var e errorBody
		if code := r.Do(t, "POST", "/api/v1/agents/x/prompt", map[string]string{"message": " "}, &e); code != 400 || e.Error != "validation_error" {
			t.Errorf("empty prompt: %d %+v", code, e)
		}
		if code := r.Do(t, "GET", "/api/v1/agents/x/logs?tail=-1", nil, &e); code != 400 || e.Error != "validation_error" {
			t.Errorf("tail=-1: %d %+v", code, e)
		}
	})
	t.Run("agent types", func(t *testing.T) {
		var out struct {
			AgentTypes []struct {
				ID          string   `json:"id"`
				RequiredEnv []string `json:"required_env"`
				Protocol    string   `json:"protocol"`
			} `json:"agent_types"`
		}
		if code := r.Do(t, "GET", "/api/v1/agent-types", nil, &out); code != 200 {
			t.Fatalf("HTTP %d", code)
		}
		found := map[string]bool{}
		for _, a := range out.AgentTypes {
			found[a.ID] = true
		}
		if !found["augment-agent"] || !found["npm-example"] || !found["acp-normal"] {
			t.Errorf("agent types %+v", out.AgentTypes)
		}
	})
}

func TestAuthentication(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a runner")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "false", "CONCLAVE_RUNNER_CLIENT_TOKENS": "s3cret-0123456789abc"})
	var e errorBody
	if code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{"task_id": "t", "agent_type": "acp-normal", "workspace_path": r.workspace(t)}, &e); code != http.StatusUnauthorized || e.HTTPStatus != 401 {
		t.Fatalf("without a token: %d %+v", code, e)
	}
	r.Token = "wrong"
	if code := r.Do(t, "GET", "/api/v1/agent-types", nil, &e); code != http.StatusUnauthorized {
		t.Fatalf("with a wrong token: %d %+v", code, e)
	}
	r.Token = "s3cret-0123456789abc"
	if code := r.Do(t, "GET", "/api/v1/agent-types", nil, nil); code != http.StatusOK {
		t.Fatalf("with the token: %d", code)
	}
}

// TestRateLimit: past its burst, a client gets 429 rate_limited.
func TestRateLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a runner")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_CLIENT_RATE": "0.001", "CONCLAVE_RUNNER_CLIENT_BURST": "3"})
	for range 3 {
		if code := r.Do(t, "GET", "/api/v1/agent-types", nil, nil); code != http.StatusOK {
			t.Fatalf("within the burst: HTTP %d", code)
		}
	}
	var e errorBody
	if code := r.Do(t, "GET", "/api/v1/agent-types", nil, &e); code != http.StatusTooManyRequests || e.Error != "rate_limited" || e.HTTPStatus != 429 {
		t.Fatalf("past the burst: %d %+v", code, e)
	}
	// Every 429 says when to come back.
	resp, err := http.Get(r.Base + "/api/v1/agent-types")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("past the burst: %d with Retry-After %q, want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestBadRequests: whatever is wrong with a REST request itself (its size,
// its Content-Type, its JSON, its path or its method), the answer is
// Kandev's error body with a fitting status.
func TestBadRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a runner")
	}
	t.Parallel()
	r := startRunner(t, nil)
	launch := `{"task_id":"t","agent_type":"acp-normal","workspace_path":"` + r.workspace(t) + `"}`
	// Valid JSON, and over the 1 MiB limit.
	tooLarge := `{"task_id":"t","agent_type":"acp-normal","metadata":{"x":"` + strings.Repeat("x", 1<<20) + `"}}`
	for _, tt := range []struct {
		name, method, path, contentType string
		body                            io.Reader
		status                          int
		code, message                   string
	}{
		{"a body over the limit", "POST", "/api/v1/agents/launch", "application/json", strings.NewReader(tooLarge), 413, "payload_too_large", "1048576"},
		{"a body over the limit, chunked", "POST", "/api/v1/agents/launch", "application/json", io.MultiReader(strings.NewReader(tooLarge)), 413, "payload_too_large", "1048576"},
		{"a body over the limit on an unknown path", "POST", "/api/v1/nope", "application/json", strings.NewReader(tooLarge), 413, "payload_too_large", "1048576"},
		{"a wrong Content-Type", "POST", "/api/v1/agents/launch", "text/plain", strings.NewReader(launch), 415, "unsupported_media_type", "application/json"},
		{"a form", "POST", "/api/v1/agents/x/cancel", "application/x-www-form-urlencoded", strings.NewReader("reason=x"), 415, "unsupported_media_type", "application/json"},
		{"malformed JSON", "POST", "/api/v1/agents/launch", "application/json", strings.NewReader(`{"task_id":`), 400, "bad_request", ""},
		{"JSON that is not an object", "POST", "/api/v1/agents/launch", "application/json", strings.NewReader(`["t"]`), 400, "bad_request", ""},
		{"a field of the wrong type", "POST", "/api/v1/agents/launch", "application/json", strings.NewReader(`{"task_id":1}`), 400, "bad_request", ""},
		{"an unknown path under the API", "GET", "/api/v1/nope", "", nil, 404, "not_found", "no endpoint"},
		{"an unknown path", "GET", "/nope", "", nil, 404, "not_found", "no endpoint"},
		{"a wrong method", "PUT", "/api/v1/agents/launch", "application/json", strings.NewReader(launch), 405, "method_not_allowed", "DELETE, POST"}, // DELETE: "launch" is also a possible instance id
		{"a wrong method on a GET route", "POST", "/api/v1/agent-types", "application/json", strings.NewReader(`{}`), 405, "method_not_allowed", "GET, HEAD"},
		// Ids in the path: a 400 naming the field, before marshalling
		// (which fails on invalid UTF-8) or the store.
		{"an instance id not UTF-8", "GET", "/api/v1/agents/%FF%FE/status", "", nil, 400, "validation_error", "instance_id"},
		{"a task id not UTF-8", "GET", "/api/v1/tasks/%FF%FE", "", nil, 400, "validation_error", "task_id"},
		{"deleting an instance id not UTF-8", "DELETE", "/api/v1/agents/%FF%FE", "", nil, 400, "validation_error", "instance_id"},
		{"prompting an instance id not UTF-8", "POST", "/api/v1/agents/%FF%FE/prompt", "application/json", strings.NewReader(`{"message":"hi"}`), 400, "validation_error", "instance_id"},
		{"following an instance id not UTF-8", "GET", "/api/v1/agents/%FF%FE/logs?follow=true", "", nil, 400, "validation_error", "instance_id"},
		{"an over-long instance id", "GET", "/api/v1/agents/" + strings.Repeat("a", 10000) + "/status", "", nil, 400, "validation_error", "instance_id"},
		{"an over-long task id", "GET", "/api/v1/tasks/" + strings.Repeat("a", 10000), "", nil, 400, "validation_error", "task_id"},
		{"an instance id with an escaped slash", "GET", "/api/v1/agents/a%2Fb/status", "", nil, 400, "validation_error", "instance_id"},
		{"an instance id with a NUL", "GET", "/api/v1/agents/a%00b/session", "", nil, 400, "validation_error", "instance_id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, r.Base+tt.path, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, data := testenv.Do(t, req)
			var e errorBody
			dec := json.NewDecoder(strings.NewReader(string(data)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&e); err != nil || resp.StatusCode != tt.status || e.HTTPStatus != tt.status || e.Error != tt.code ||
				!strings.Contains(e.Message+" "+e.Details, tt.message) || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d %s %.300s; want %d with the REST error body, error %s, mentioning %q",
					resp.StatusCode, resp.Header.Get("Content-Type"), data, tt.status, tt.code, tt.message)
			}
			if strings.Contains(string(data), "aaaaaaaa") || strings.Contains(string(data), "/nope") {
				t.Errorf("the body echoes the path: %.300s", data)
			}
			if tt.status == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != tt.message {
				t.Errorf("Allow = %q, want %q", resp.Header.Get("Allow"), tt.message)
			}
		})
	}
}
