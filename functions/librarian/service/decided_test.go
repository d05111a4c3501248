package service_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// decidedPage is GET /reviews?status=decided's body.
type decidedPage struct {
	Requests      []json.RawMessage `json:"requests"`
	NextPageToken string            `json:"next_page_token"`
}

// GET /reviews?status=decided lists the decisions, latest first, a page
// at a time, to reviewers only: the pipeline's and a reviewer's, with who
// decided; an escalated request is not there until it is decided; bad
// page parameters are 400s with a JSON body.
func TestListDecided(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var empty decidedPage
	if r := e.do(t, "GET", "/reviews?status=decided", reviewerToken, nil); r.status != 200 || json.Unmarshal(r.body, &empty) != nil || empty.Requests == nil || len(empty.Requests) != 0 || empty.NextPageToken != "" {
		t.Fatalf("nothing decided: %d %s", r.status, r.body)
	}
	approved := e.do(t, "POST", "/agent/request", claudeToken, librarianApproval()).response(t)
	rejected := e.do(t, "POST", "/agent/request", claudeToken, map[string]any{"request_type": "APPROVAL", "action": "create", "target_type": "design", "content": "# x"}).response(t)
	escalated := escalate(t, e, "docs/design/auth-flow.md")
	if approved.Status != "approved" || rejected.Status != "rejected" {
		t.Fatalf("decisions %s %s", approved.Status, rejected.Status)
	}
	list := func(query string) []*librarianv1.DecidedRequest {
		t.Helper()
		var out []*librarianv1.DecidedRequest
		path := "/reviews?status=decided&" + query
		for pages := 0; ; pages++ {
			r := e.do(t, "GET", path, reviewerToken, nil)
			var page decidedPage
			if r.status != 200 || json.Unmarshal(r.body, &page) != nil || pages > 5 {
				t.Fatalf("GET %s: %d %s", path, r.status, r.body)
			}
			for _, raw := range page.Requests {
				var d librarianv1.DecidedRequest
				if err := protojson.Unmarshal(raw, &d); err != nil {
					t.Fatalf("%v: %s", err, raw)
				}
				out = append(out, &d)
			}
			if page.NextPageToken == "" {
				return out
			}
			path = "/reviews?status=decided&" + query + "&page_token=" + url.QueryEscape(page.NextPageToken)
		}
	}
	ids := func(ds []*librarianv1.DecidedRequest) []string {
		var out []string
		for _, d := range ds {
			out = append(out, d.GetRequestId())
		}
		return out
	}
	if got, want := ids(list("page_size=1")), []string{rejected.RequestId, approved.RequestId}; !slices.Equal(got, want) {
		t.Fatalf("decided before the review: %v, want %v", got, want)
	}
	if r := e.do(t, "POST", "/reviews/"+escalated.RequestId+"/decision", reviewerToken, map[string]any{"decision": "reject", "comment": "Not this way."}); r.status != 200 {
		t.Fatalf("decision: %d %s", r.status, r.body)
	}
	all := list("page_size=2")
	if got, want := ids(all), []string{escalated.RequestId, rejected.RequestId, approved.RequestId}; !slices.Equal(got, want) {
		t.Fatalf("decided: %v, want %v", got, want)
	}
	byReviewer, byLibrarian := all[0], all[2]
	if byReviewer.GetDecision() != "rejected" || byReviewer.GetDecidedBy() != "reviewer" || byReviewer.GetReviewer() != "alice" || byReviewer.GetComment() != "Not this way." ||
		byReviewer.GetAgentId() != "claude-3" || byReviewer.GetDecidedAt() == nil || byReviewer.GetRequest().GetStatus() != "rejected" {
		t.Errorf("the reviewer's decision: %v", byReviewer)
	}
	if byLibrarian.GetDecision() != "approved" || byLibrarian.GetDecidedBy() != "librarian" || byLibrarian.GetReviewer() != "" ||
		byLibrarian.GetRequest().GetResponse().GetApprovedLocation() != "docs/design/new-feature.md" {
		t.Errorf("the pipeline's decision: %v", byLibrarian)
	}

	if r := e.do(t, "GET", "/reviews?status=decided", claudeToken, nil); r.status != 403 || r.errorCode(t) != "reviewers_only" {
		t.Errorf("an agent listed decisions: %d %s", r.status, r.body)
	}
	if r := e.do(t, "GET", "/reviews?status=decided", "", nil); r.status != 401 {
		t.Errorf("no token: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ query, code string }{
		{"page_token=garbage", "invalid_page_token"},
		{"page_token=" + url.QueryEscape("eyJhIjoiMTIjcmVxLXgifQ"), "invalid_page_token"},
		{"page_size=0", "invalid_page_size"},
		{"page_size=101", "invalid_page_size"},
		{"page_size=ten", "invalid_page_size"},
	} {
		if r := e.do(t, "GET", "/reviews?status=decided&"+c.query, reviewerToken, nil); r.status != 400 || r.errorCode(t) != c.code {
			t.Errorf("?%s: %d %s", c.query, r.status, r.body)
		}
	}
}
