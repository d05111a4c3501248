package service_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// FuzzRESTBodies: whatever body a client sends to the REST routes that
// take one, the runner answers without a 5xx, and every error is
// Kandev's body. One runner serves every input.
func FuzzRESTBodies(f *testing.F) {
	r := startRunner(f, nil)
	routes := []string{"/api/v1/agents/launch", "/api/v1/agents/missing/prompt", "/api/v1/agents/missing/cancel"}
	for _, body := range []string{
		`{"task_id":"t1","agent_type":"acp-normal","workspace_path":"/nowhere"}`, `{"task_id":1}`, `{`, `[]`, `null`, `""`, ``,
		`{"task_id":"a\u0000b","agent_type":"acp-normal"}`, `{"task_id":"` + strings.Repeat("t", 200) + `"}`,
		`{"env":{"A=B":"x"}}`, `{"env":{"TRACEPARENT":"x"}}`, `{"priority":-1}`, `{"metadata":{"session_id":5}}`,
		`{"message":"hi"}`, `{"message":""}`, `{"reason":"x"}`, `{"unknown":1}`, "\xff\xfe", `{"task_id":"\ud800"}`,
	} {
		for i := range routes {
			f.Add(uint8(i), body)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		path := routes[int(route)%len(routes)]
		req, err := http.NewRequest("POST", r.Base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, data := testenv.Do(t, req)
		if resp.StatusCode >= 500 {
			t.Fatalf("POST %s %q: %d %s", path, body, resp.StatusCode, data)
		}
		if resp.StatusCode >= 400 {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			var e errorBody
			if err := dec.Decode(&e); err != nil || e.Error == "" || e.HTTPStatus != resp.StatusCode {
				t.Fatalf("POST %s %q: %d is not the REST error body: %s", path, body, resp.StatusCode, data)
			}
		}
	})
}
