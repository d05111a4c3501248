package api_test

import (
	"errors"
	"testing"

	"github.com/conclave-ai/conclave/functions/librarian/internal/api"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
)

// FuzzDecodeRequest: whatever the body, the decoder returns a request that
// passed the shape checks or an InputError with a 4xx status; it never
// panics.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		`{"agent_id":"claude-3","session_id":"sess-123","request_type":"APPROVAL","action":"create","target_type":"design","target_path":"docs/design/new-feature.md","content":"# New Feature Design","rationale":"US-123","references":["arch-001","req-045"],"deviations":[]}`,
		`{"agent_id":"copilot-2","request_type":"QUERY","content":"What are the current authentication requirements?"}`,
		`{"request_type":"REPORT","request_id":"req-aaaaaaaaaaaaaaaa","completed":true,"changes_made":["x"]}`,
		`{"deviations":[{"standard":"naming"}],"risk_assessment":"high","timestamp":"2026-01-01T00:00:00Z"}`,
		`{"target_path":"../../etc/passwd"}`, `{"deviations":[{"a":1}]}`, `{"completed":"yes"}`, `{`, `null`, `[]`, ``, "\xff",
	} {
		f.Add([]byte(seed))
	}
	limits := policy.Limits{MaxContentSize: 100 << 10, MaxReferences: 20, MaxDeviations: 5}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := api.DecodeRequest(body, limits)
		if err != nil {
			var ie *governance.InputError
			if !errors.As(err, &ie) || ie.Status < 400 || ie.Status > 499 || ie.Message == "" || ie.Code == "" {
				t.Fatalf("error %#v is not a 4xx InputError", err)
			}
			return
		}
		if req == nil {
			t.Fatal("nil request without an error")
		}
		if governance.CheckShape(req, limits) != nil {
			t.Fatal("a decoded request fails its own shape check")
		}
		if req.TargetPath != nil && governance.CheckPath(req.GetTargetPath()) != nil {
			t.Fatal("an unsafe target_path got through")
		}
		if len(req.GetReferences()) > limits.MaxReferences || len(req.GetDeviations()) > limits.MaxDeviations {
			t.Fatal("list limits not enforced")
		}
	})
}
