package service_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// The JSON examples of Kandev's protocol text (its "REST API Integration" and "HTTP API
// Errors" sections), verbatim.
const (
	kandevLaunchResponse = `{
  "id": "instance-uuid",
  "task_id": "uuid",
  "agent_type": "augment-agent",
  "container_id": "docker-id",
  "status": "starting",
  "started_at": "2026-01-10T12:00:00Z"
}`
	kandevStatusResponse = `{
  "id": "instance-uuid",
  "status": "running",
  "progress": 50,
  "started_at": "2026-01-10T12:00:00Z",
  "finished_at": null
}`
	kandevSessionResponse = `{
  "instance_id": "instance-uuid",
  "task_id": "task-uuid",
  "session_id": "abc123",
  "status": "running"
}`
	kandevErrorResponse = `{
  "error": "error_code",
  "message": "Human readable message",
  "details": "Additional context",
  "http_status": 400
}`
)

// rawJSON sends a REST request and returns the status and the body's
// top-level members, undecoded.
func (r *testRunner) rawJSON(t *testing.T, method, path string, body any) (int, map[string]json.RawMessage) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, r.Base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, data := testenv.Do(t, req)
	var out map[string]json.RawMessage
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, data, err)
	}
	return resp.StatusCode, out
}

// jsonKind is a JSON value's type: string, number, bool, null, object or
// array.
func jsonKind(v json.RawMessage) string {
	s := strings.TrimSpace(string(v))
	switch {
	case s == "null":
		return "null"
	case s == "true" || s == "false":
		return "bool"
	case strings.HasPrefix(s, `"`):
		return "string"
	case strings.HasPrefix(s, "{"):
		return "object"
	case strings.HasPrefix(s, "["):
		return "array"
	}
	return "number"
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkShape compares a response's members with Kandev's example: the
// same keys (plus extra, documented ones, if any), each of the example's
// JSON type; a member the example shows as null may be null or a string
// (a time). nullable names members that must be null here.
func checkShape(t *testing.T, what, example string, got map[string]json.RawMessage, extra []string, null ...string) {
	t.Helper()
	var want map[string]json.RawMessage
	if err := json.Unmarshal([]byte(example), &want); err != nil {
		t.Fatal(err)
	}
	wantKeys := append(sortedKeys(want), extra...)
	sort.Strings(wantKeys)
	if gotKeys := sortedKeys(got); !slices.Equal(gotKeys, wantKeys) {
		t.Errorf("%s: keys %v, want %v (Kandev's %v plus %v)", what, gotKeys, wantKeys, sortedKeys(want), extra)
	}
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			continue
		}
		switch wk, gk := jsonKind(v), jsonKind(g); {
		case slices.Contains(null, k) && gk != "null":
			t.Errorf("%s: %s is %s, want null", what, k, g)
		case wk == "null" && (gk == "null" || gk == "string"):
		case wk != gk:
			t.Errorf("%s: %s is %s (%s), Kandev's is %s (%s)", what, k, g, gk, v, wk)
		}
	}
}

// TestRESTShapes checks the raw JSON of each REST response against
// Kandev's examples: every member they show is there, with its type, even
// when it is empty (a starting instance's "progress": 0, "container_id": ""
// and "finished_at": null; an error's "details": ""), and the launch
// response has exactly Kandev's members.
func TestRESTShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	// One worker, held by a slow agent: the second launch stays starting.
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_WORKERS": "1"})
	busy := r.Launch(t, "acp-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "hold the worker"})
	r.WaitLogWithin(t, busy.ID, "tool_call write notes.txt", time.Minute)

	launch := map[string]any{"task_id": "task-shapes", "agent_type": "acp-normal", "workspace_path": r.workspace(t),
		"env": map[string]string{"TASK_DESCRIPTION": "shapes"}, "priority": 1, "metadata": map[string]any{}}
	code, launched := r.rawJSON(t, "POST", "/api/v1/agents/launch", launch)
	if code != http.StatusOK {
		t.Fatalf("launch: %d %v", code, launched)
	}
	checkShape(t, "POST /api/v1/agents/launch", kandevLaunchResponse, launched, nil)
	var id string
	_ = json.Unmarshal(launched["id"], &id)
	if s := string(launched["status"]); s != `"starting"` {
		t.Errorf("launch: status %s", s)
	}

	_, st := r.rawJSON(t, "GET", "/api/v1/agents/"+id+"/status", nil)
	checkShape(t, "GET status (starting)", kandevStatusResponse, st, []string{"agent_type", "container_id", "error", "review_url", "task_id"}, "finished_at")
	if string(st["progress"]) != "0" || string(st["container_id"]) != `""` || string(st["status"]) != `"starting"` {
		t.Errorf("a starting instance's status: %v", st)
	}

	_, sess := r.rawJSON(t, "GET", "/api/v1/agents/"+id+"/session", nil)
	checkShape(t, "GET session (starting)", kandevSessionResponse, sess, nil)

	_, task := r.rawJSON(t, "GET", "/api/v1/tasks/task-shapes", nil)
	if jsonKind(task["metadata"]) != "object" {
		t.Errorf("GET task: metadata %s, want an object; the task: %v", task["metadata"], task)
	}

	for _, tt := range []struct {
		method, path string
		body         any
		status       int
	}{
		{"GET", "/api/v1/agents/0123456789abcdef0123456789abcdef/status", nil, http.StatusNotFound},
		{"POST", "/api/v1/agents/launch", map[string]any{"task_id": "t", "agent_type": "no-such-type", "workspace_path": "/"}, http.StatusBadRequest},
		{"GET", "/api/v1/no-such-path", nil, http.StatusNotFound},
	} {
		code, body := r.rawJSON(t, tt.method, tt.path, tt.body)
		if code != tt.status {
			t.Errorf("%s %s: HTTP %d, want %d", tt.method, tt.path, code, tt.status)
		}
		checkShape(t, tt.method+" "+tt.path, kandevErrorResponse, body, nil)
	}

	// Free the worker: the queued launch runs and completes.
	r.Do(t, "POST", "/api/v1/agents/"+busy.ID+"/cancel", map[string]string{"reason": "done"}, nil)
	done := r.WaitStatus(t, id, "completed", "failed")
	_, st = r.rawJSON(t, "GET", "/api/v1/agents/"+id+"/status", nil)
	checkShape(t, "GET status (completed)", kandevStatusResponse, st, []string{"agent_type", "container_id", "error", "review_url", "task_id"})
	if jsonKind(st["finished_at"]) != "string" || string(st["progress"]) != "100" {
		t.Errorf("a completed instance's status: %v (%+v)", st, done)
	}
	testenv.EventuallyNoError(t, time.Minute, "a completed instance's session id", func() error {
		if _, sess = r.rawJSON(t, "GET", "/api/v1/agents/"+id+"/session", nil); string(sess["session_id"]) == `""` {
			return fmt.Errorf("no session id: %v", sess)
		}
		return nil
	})
	checkShape(t, "GET session (completed)", kandevSessionResponse, sess, nil)
}
