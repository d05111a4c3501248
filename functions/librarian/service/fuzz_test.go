package service_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/conclave-ai/conclave/functions/librarian/service"
)

// FuzzRESTBodies: whatever body an agent or a reviewer sends to the routes
// that take JSON, the Librarian answers without a 5xx, and every error is
// the Librarian's error body. One Librarian serves every input.
func FuzzRESTBodies(f *testing.F) {
	e := newEnv(f, func(c *service.Config) { c.APIRate = "1000000/minute" })
	routes := []struct{ path, token string }{
		{"/agent/request", claudeToken},
		{"/agent/context", claudeToken},
		{"/reviews/req-zzzzzzzzzzzzzzzz/decision", reviewerToken},
	}
	for _, body := range []string{
		`{"agent_id":"claude-3","request_type":"QUERY","content":"what"}`, `{"request_type":"APPROVAL","action":"create","target_type":"docs","target_path":"a.md","content":"x"}`,
		`{"request_type":"REPORT","request_id":"req-zzzzzzzzzzzzzzzz","completed":true}`, `{"agent_id":"a\u0000"}`, `{"target_path":"../../etc"}`,
		`{"deviations":[{"fields":{"a":1}}]}`, `{"query":"auth","limit":5}`, `{"query":"","limit":-1}`, `{"decision":"approve","comment":"ok"}`,
		`{"decision":"maybe"}`, `{`, `[]`, `null`, `""`, ``, `{"unknown":1}`, "\xff\xfe", `{"content":"\ud800"}`,
	} {
		for i := range routes {
			f.Add(uint8(i), body)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := routes[int(route)%len(routes)]
		rep := e.do(t, http.MethodPost, r.path, r.token, body)
		if rep.status >= 500 {
			t.Fatalf("POST %s %q: %d %s", r.path, body, rep.status, rep.body)
		}
		if rep.status >= 400 {
			var b struct {
				Error struct {
					Code    int    `json:"code"`
					Status  string `json:"status"`
					Message string `json:"message"`
					Field   string `json:"field"`
				} `json:"error"`
			}
			dec := json.NewDecoder(bytes.NewReader(rep.body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&b); err != nil || b.Error.Code != rep.status || b.Error.Status == "" || b.Error.Message == "" {
				t.Fatalf("POST %s %q: %d is not the Librarian's error body: %s", r.path, body, rep.status, rep.body)
			}
		}
	})
}
