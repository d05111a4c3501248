package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// Static tokens of the test agents and reviewer.
const (
	claudeToken   = "claude-3-test-token-0123456789"
	copilotToken  = "copilot-2-test-token-0123456789"
	geminiToken   = "gemini-pro-test-token-0123456789"
	reviewerToken = "alice-reviewer-token-0123456789"
)

type env struct {
	srv   *httptest.Server
	lib   *service.Librarian
	st    store.Store
	queue queue.Queue
}

// newEnv serves the Librarian's handler over embedded storage, with the
// built-in configuration and a seed graph.
func newEnv(t testing.TB, mod func(*service.Config)) *env {
	t.Helper()
	return newEnvAt(t, mod, nil)
}

// newEnvAt is newEnv with the handler's clock (nil: time.Now).
func newEnvAt(t testing.TB, mod func(*service.Config), now func() time.Time) *env {
	t.Helper()
	st := testenv.EmbeddedStore(t, service.Tables...)
	q := testenv.EmbeddedQueue(t, service.Queues(service.Config{})...)
	ctx := context.Background()
	cfg := service.Config{APIRate: "60/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second,
		AgentTokens:    []string{"claude-3=" + claudeToken, "copilot-2=" + copilotToken, "gemini-pro=" + geminiToken},
		ReviewerTokens: []string{"alice=" + reviewerToken}}
	if mod != nil {
		mod(&cfg)
	}
	lib, err := service.NewHandler(cfg, service.Deps{Store: st, Queue: q, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []graph.Node{
		{ID: "arch-001", Type: "architecture", Path: "docs/architecture/overview.md", Title: "Architecture overview", Text: "Services authenticate with OAuth tokens."},
		{ID: "req-045", Type: "docs", Path: "docs/requirements.md", Title: "Authentication requirements", Text: "Users sign in with passwords and second factors; authentication is required."},
	} {
		if err := lib.Graph.Put(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	return &env{srv: newServer(t, lib), lib: lib, st: st, queue: q}
}

func newServer(t testing.TB, lib *service.Librarian) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(lib.Handler)
	t.Cleanup(srv.Close)
	return srv
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (e *env) do(t testing.TB, method, path, token string, body any) reply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: raw}
}

func (r reply) response(t *testing.T) *librarianv1.LibrarianResponse {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var out librarianv1.LibrarianResponse
	if err := protojson.Unmarshal(r.body, &out); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return &out
}

func (r reply) errorCode(t *testing.T) string {
	t.Helper()
	var b struct {
		Error struct {
			Code    int    `json:"code"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &b); err != nil || b.Error.Code != r.status || b.Error.Message == "" {
		t.Fatalf("not a JSON error body (%v): %d %s", err, r.status, r.body)
	}
	return b.Error.Status
}

const design = "# New Feature Design\n\n## Overview\nWhat.\n\n## Design\nHow.\n\n## Alternatives\nNone.\n"

func librarianApproval() map[string]any {
	return map[string]any{
		"agent_id": "claude-3", "session_id": "sess-123", "request_type": "APPROVAL", "action": "create",
		"target_type": "design", "target_path": "docs/design/new-feature.md", "content": design,
		"rationale": "Implementing user story US-123", "references": []string{"arch-001", "req-045"}, "deviations": []any{},
	}
}

// events drains the queue's envelopes.
func (e *env) events(t *testing.T) []*eventsv1.Envelope {
	t.Helper()
	var out []*eventsv1.Envelope
	for {
		msgs, err := e.queue.Receive(context.Background(), service.EventsQueue.Name, queue.ReceiveOptions{Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			return out
		}
		for _, m := range msgs {
			env := &eventsv1.Envelope{}
			if err := protojson.Unmarshal(m.Body, env); err != nil {
				t.Fatal(err)
			}
			if m.Attributes["type"] != env.Type || m.Attributes["event_id"] != env.Id {
				t.Fatalf("attributes %v do not match the envelope %v", m.Attributes, env)
			}
			out = append(out, env)
			_ = e.queue.Delete(context.Background(), service.EventsQueue.Name, m.ReceiptHandle)
		}
	}
}

func types(envs []*eventsv1.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = e.Type
	}
	return out
}

func TestLibrarianApprovalToCompletion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	resp := e.do(t, "POST", "/agent/request", claudeToken, librarianApproval()).response(t)
	if resp.Status != "approved" || resp.GetApprovedLocation() != "docs/design/new-feature.md" || resp.GetAssignedId() == "" || resp.Confidence != 1 || resp.RequestId == "" {
		t.Fatalf("response %v", resp)
	}
	status := e.do(t, "GET", "/agent/status/"+resp.RequestId, claudeToken, nil)
	var st librarianv1.RequestStatus
	if err := protojson.Unmarshal(status.body, &st); err != nil || st.Status != "approved" || st.Response.GetAssignedId() != resp.GetAssignedId() {
		t.Fatalf("status %d %s", status.status, status.body)
	}
	if r := e.do(t, "GET", "/agent/status/"+resp.RequestId, copilotToken, nil); r.status != 403 || r.errorCode(t) != "not_your_request" {
		t.Fatalf("another agent read the status: %d %s", r.status, r.body)
	}
	report := map[string]any{"agent_id": "claude-3", "request_type": "REPORT", "request_id": resp.RequestId, "completed": true,
		"changes_made": []string{"docs/design/new-feature.md"}}
	done := e.do(t, "POST", "/agent/request", claudeToken, report).response(t)
	if done.RequestId != resp.RequestId || done.Status != "approved" {
		t.Fatalf("report %v", done)
	}
	node, err := e.lib.Graph.Get(context.Background(), resp.GetAssignedId())
	if err != nil || node.Path != "docs/design/new-feature.md" || node.Title != "New Feature Design" || !slices.Equal(node.References, []string{"arch-001", "req-045"}) {
		t.Fatalf("graph node %+v %v", node, err)
	}
	// The same REPORT again is a retry (its answer was lost): answered
	// again, nothing changes twice. Another REPORT is an illegal transition.
	if again := e.do(t, "POST", "/agent/request", claudeToken, report).response(t); again.RequestId != resp.RequestId || !strings.Contains(again.Feedback, "already completed") {
		t.Fatalf("retried report: %v", again)
	}
	other := map[string]any{"agent_id": "claude-3", "request_type": "REPORT", "request_id": resp.RequestId, "completed": true,
		"changes_made": []string{"docs/design/something-else.md"}}
	if r := e.do(t, "POST", "/agent/request", claudeToken, other); r.status != 409 || r.errorCode(t) != "illegal_transition" {
		t.Fatalf("second report: %d %s", r.status, r.body)
	}
	got := types(e.events(t))
	want := []string{"librarian.request.submitted", "librarian.request.approved", "librarian.request.completed", "librarian.specification.changed"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// Creating the same location again is rejected: it exists now.
	again := e.do(t, "POST", "/agent/request", claudeToken, librarianApproval()).response(t)
	if again.Status != "rejected" || len(again.Violations) == 0 || len(again.Suggestions) == 0 {
		t.Fatalf("recreate %v", again)
	}
}

func TestEscalationAndReview(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	req := librarianApproval()
	req["risk_assessment"] = "high: changes the authentication flow"
	resp := e.do(t, "POST", "/agent/request", claudeToken, req).response(t)
	if resp.Status != "escalated" || resp.GetEscalationReason() == "" || resp.GetEstimatedReviewTime() != 1440 ||
		resp.GetHumanReviewUrl() != e.srv.URL+"/review/"+resp.RequestId {
		t.Fatalf("response %v", resp)
	}
	if r := e.do(t, "GET", "/reviews?status=escalated", claudeToken, nil); r.status != 403 || r.errorCode(t) != "reviewers_only" {
		t.Fatalf("agent listed reviews: %d %s", r.status, r.body)
	}
	if r := e.do(t, "GET", "/reviews?status=approved", reviewerToken, nil); r.status != 400 {
		t.Fatalf("unsupported status: %d %s", r.status, r.body)
	}
	list := e.do(t, "GET", "/reviews?status=escalated", reviewerToken, nil)
	if list.status != 200 || !strings.Contains(string(list.body), resp.RequestId) {
		t.Fatalf("list %d %s", list.status, list.body)
	}
	for _, bad := range []struct {
		body any
		code int
	}{
		{map[string]any{"decision": "maybe", "comment": "x"}, 400},
		{map[string]any{"decision": "approve"}, 400},
		{map[string]any{"decision": "approve", "comment": "ok", "extra": 1}, 400},
		{"{", 400},
	} {
		if r := e.do(t, "POST", "/reviews/"+resp.RequestId+"/decision", reviewerToken, bad.body); r.status != bad.code {
			t.Fatalf("decision %v: %d %s", bad.body, r.status, r.body)
		}
	}
	if r := e.do(t, "POST", "/reviews/"+resp.RequestId+"/decision", claudeToken, map[string]any{"decision": "approve", "comment": "self"}); r.status != 403 {
		t.Fatalf("agent decided its own request: %d", r.status)
	}
	ok := e.do(t, "POST", "/reviews/"+resp.RequestId+"/decision", reviewerToken, map[string]any{"decision": "approve", "comment": "Reviewed the auth change."})
	var st librarianv1.RequestStatus
	if err := protojson.Unmarshal(ok.body, &st); err != nil || ok.status != 200 || st.Status != "approved" ||
		!strings.Contains(st.Response.GetFeedback(), "alice") || st.Response.GetAssignedId() == "" {
		t.Fatalf("decision %d %s", ok.status, ok.body)
	}
	if r := e.do(t, "POST", "/reviews/"+resp.RequestId+"/decision", reviewerToken, map[string]any{"decision": "reject", "comment": "too late"}); r.status != 409 {
		t.Fatalf("second decision: %d %s", r.status, r.body)
	}
	if r := e.do(t, "POST", "/reviews/req-aaaaaaaaaaaaaaaa/decision", reviewerToken, map[string]any{"decision": "reject", "comment": "x"}); r.status != 404 {
		t.Fatalf("unknown request: %d %s", r.status, r.body)
	}
	if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.submitted", "librarian.request.escalated", "librarian.request.approved"}) {
		t.Fatalf("events %v", got)
	}
}

func TestQueryContextCapabilitiesDocsMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	q := e.do(t, "POST", "/agent/request", copilotToken, map[string]any{"agent_id": "copilot-2", "request_type": "QUERY",
		"content": "What are the current authentication requirements?"}).response(t)
	if q.Status != "approved" || len(q.RelevantNodes) != 1 || q.RelevantNodes[0].Id != "req-045" || q.Context.GetFields()["query"] == nil {
		t.Fatalf("query %v", q)
	}
	c := e.do(t, "POST", "/agent/context", geminiToken, map[string]any{"query": "OAuth", "target_types": []string{"architecture"}})
	var cr librarianv1.ContextResponse
	if err := protojson.Unmarshal(c.body, &cr); err != nil || len(cr.Nodes) != 1 || cr.Nodes[0].Id != "arch-001" {
		t.Fatalf("context %d %s", c.status, c.body)
	}
	caps := e.do(t, "GET", "/agent/capabilities", copilotToken, nil)
	var ac librarianv1.AgentCapabilities
	if err := protojson.Unmarshal(caps.body, &ac); err != nil || ac.AgentId != "copilot-2" || ac.RateLimit != "200/hour" || ac.MaxRequestSizeBytes != 10<<10 ||
		!slices.Equal(ac.AllowedTargets, []string{"code"}) {
		t.Fatalf("capabilities %d %s", caps.status, caps.body)
	}
	docs := e.do(t, "GET", "/docs", "", nil)
	var openapi struct {
		OpenAPI    string         `json:"openapi"`
		Paths      map[string]any `json:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(docs.body, &openapi); err != nil || openapi.OpenAPI != "3.1.0" || len(openapi.Paths) != 7 ||
		openapi.Components.Schemas["AgentRequest"].Properties["risk_assessment"] == nil || openapi.Components.Schemas["ViolationDetail"].Properties["rule"] == nil ||
		openapi.Components.Schemas["DecidedRequests"].Properties["next_page_token"] == nil || openapi.Components.Schemas["DecidedRequest"].Properties["decided_by"] == nil {
		t.Fatalf("docs %d %.300s", docs.status, docs.body)
	}
	// One rejected request beside the approved query.
	e.do(t, "POST", "/agent/request", claudeToken, map[string]any{"request_type": "APPROVAL", "action": "create", "target_type": "design", "content": "# x"})
	m := e.do(t, "GET", "/metrics", reviewerToken, nil)
	var metrics map[string]any
	if err := json.Unmarshal(m.body, &metrics); err != nil || metrics["approval_rate"] != 50.0 || metrics["escalation_rate"] != 0.0 || metrics["total"] != 2.0 {
		t.Fatalf("metrics %d %s", m.status, m.body)
	}
	if _, ok := metrics["avg_validation_ms"].(float64); !ok {
		t.Fatalf("metrics %s", m.body)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	approved := e.do(t, "POST", "/agent/request", claudeToken, librarianApproval()).response(t)
	with := func(k string, v any) map[string]any {
		r := librarianApproval()
		if v == nil {
			delete(r, k)
		} else {
			r[k] = v
		}
		return r
	}
	tests := []struct {
		name         string
		method, path string
		token        string
		body         any
		status       int
		code         string
	}{
		{"malformed JSON", "POST", "/agent/request", claudeToken, `{"agent_id": "claude-3",`, 400, "malformed_json"},
		{"not an object", "POST", "/agent/request", claudeToken, `[1,2]`, 400, "malformed_json"},
		{"unknown field", "POST", "/agent/request", claudeToken, with("mood", "happy"), 400, "malformed_json"},
		{"wrong type", "POST", "/agent/request", claudeToken, with("references", "arch-001"), 400, "malformed_json"},
		{"unknown request_type", "POST", "/agent/request", claudeToken, with("request_type", "DEMAND"), 400, "unknown_request_type"},
		{"unknown action", "POST", "/agent/request", claudeToken, with("action", "explode"), 400, "unknown_action"},
		{"unknown target_type", "POST", "/agent/request", claudeToken, with("target_type", "kitchen"), 400, "unknown_target_type"},
		{"path traversal", "POST", "/agent/request", claudeToken, with("target_path", "../../etc/passwd"), 400, "invalid_target_path"},
		{"absolute path", "POST", "/agent/request", claudeToken, with("target_path", "/etc/passwd"), 400, "invalid_target_path"},
		{"10 MB content", "POST", "/agent/request", claudeToken, with("content", strings.Repeat("x", 10<<20)), 413, "request_too_large"},
		{"over max_content_size", "POST", "/agent/request", geminiToken, map[string]any{"agent_id": "gemini-pro", "request_type": "QUERY", "content": strings.Repeat("x", 101<<10)}, 413, "content_too_large"},
		{"over the agent's max_request_size", "POST", "/agent/request", claudeToken, with("content", design+strings.Repeat("x", 60<<10)), 413, "request_too_large"},
		{"too many references", "POST", "/agent/request", claudeToken, with("references", make21()), 400, "too_many_references"},
		{"too many deviations", "POST", "/agent/request", claudeToken, with("deviations", []any{dev(), dev(), dev(), dev(), dev(), dev()}), 400, "too_many_deviations"},
		{"no token", "POST", "/agent/request", "", librarianApproval(), 401, "unauthenticated"},
		{"unknown token", "POST", "/agent/request", "lib_0123456789abcdef_" + strings.Repeat("A", 43), librarianApproval(), 401, "unauthenticated"},
		{"garbage token", "POST", "/agent/request", "nope", librarianApproval(), 401, "unauthenticated"},
		{"token for another agent", "POST", "/agent/request", copilotToken, librarianApproval(), 403, "token_for_another_agent"},
		{"reviewer token as an agent", "POST", "/agent/request", reviewerToken, librarianApproval(), 403, "agents_only"},
		{"capability missing", "POST", "/agent/request", geminiToken, with("agent_id", "gemini-pro"), 403, "capability_missing"},
		{"target not allowed", "POST", "/agent/request", claudeToken, with("target_type", "docs"), 403, "target_not_allowed"},
		{"REPORT for someone else's request", "POST", "/agent/request", copilotToken, map[string]any{"agent_id": "copilot-2", "request_type": "REPORT",
			"request_id": approved.RequestId, "completed": true, "changes_made": []string{"x"}}, 403, ""},
		{"REPORT of an unknown request", "POST", "/agent/request", claudeToken, map[string]any{"request_type": "REPORT",
			"request_id": "req-zzzzzzzzzzzzzzzz", "completed": true, "changes_made": []string{"x"}}, 404, "request_not_found"},
		{"unknown status", "GET", "/agent/status/req-zzzzzzzzzzzzzzzz", claudeToken, nil, 404, "request_not_found"},
		// Ids follow pkg/ids and the Librarian's own form: a 400 naming
		// the field, before the store is asked.
		{"malformed status id", "GET", "/agent/status/..%2F..%2Fetc", claudeToken, nil, 400, "invalid_request_id"},
		{"status id not UTF-8", "GET", "/agent/status/%FF%FE", claudeToken, nil, 400, "invalid_request_id"},
		{"over-long status id", "GET", "/agent/status/" + strings.Repeat("a", 10000), claudeToken, nil, 400, "invalid_request_id"},
		{"status id with a NUL", "GET", "/agent/status/req-%00", claudeToken, nil, 400, "invalid_request_id"},
		{"decision on an id not UTF-8", "POST", "/reviews/%FF%FE/decision", reviewerToken, map[string]any{"decision": "approve", "comment": "ok"}, 400, "invalid_request_id"},
		{"agent_id not UTF-8", "GET", "/agent/capabilities?agent_id=%FF%FE", claudeToken, nil, 400, "invalid_agent_id"},
		{"agent_id with a newline", "POST", "/agent/request", claudeToken, with("agent_id", "claude-3\n"), 400, "invalid_agent_id"},
		{"REPORT of an id not the Librarian's", "POST", "/agent/request", claudeToken, map[string]any{"request_type": "REPORT",
			"request_id": "a\u0000b", "completed": true, "changes_made": []string{"x"}}, 400, "invalid_request_id"},
		{"context without query", "POST", "/agent/context", claudeToken, map[string]any{}, 400, "missing_query"},
		{"context limit", "POST", "/agent/context", claudeToken, map[string]any{"query": "x", "limit": 1000}, 400, "invalid_limit"},
		{"context target type", "POST", "/agent/context", claudeToken, map[string]any{"query": "x", "target_types": []string{"kitchen"}}, 400, "unknown_target_type"},
		{"unknown route", "GET", "/agent/nothing", claudeToken, nil, 404, "not_found"},
		{"wrong method", "DELETE", "/agent/request", claudeToken, nil, 405, "method_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.do(t, tt.method, tt.path, tt.token, tt.body)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d: %.300s", r.status, tt.status, r.body)
			}
			if tt.status == 405 && r.header.Get("Allow") != "POST" {
				t.Fatalf("Allow: %q", r.header.Get("Allow"))
			}
			if code := r.errorCode(t); tt.code != "" && code != tt.code {
				t.Fatalf("code %q, want %q: %s", code, tt.code, r.body)
			}
		})
	}
}

func make21() []string {
	out := make([]string, 21)
	for i := range out {
		out[i] = fmt.Sprint("ref-", i)
	}
	return out
}

func dev() map[string]any { return map[string]any{"standard": "naming"} }

// TestThousandRequestsInASecond: one agent fires 1,000 requests at once;
// the API's 60 a minute are answered, the rest get 429 with the headers
// that say when to come back.
func TestThousandRequestsInASecond(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	body := map[string]any{"agent_id": "copilot-2", "request_type": "QUERY", "content": "authentication"}
	var ok, limited atomic.Int32
	var mu sync.Mutex
	samples := map[string]reply{}
	var wg sync.WaitGroup
	jobs := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for range jobs {
				r := e.do(t, "POST", "/agent/request", copilotToken, body)
				switch r.status {
				case 200:
					ok.Add(1)
				case 429:
					limited.Add(1)
					mu.Lock()
					samples[r.header.Get("X-RateLimit-Scope")] = r
					mu.Unlock()
				default:
					t.Errorf("status %d: %s", r.status, r.body)
				}
			}
		})
	}
	for range 1000 {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	// Unless the run straddles a minute boundary, exactly 60 pass.
	if ok.Load() < 60 || ok.Load() > 120 || ok.Load()+limited.Load() != 1000 {
		t.Fatalf("%d answered, %d limited", ok.Load(), limited.Load())
	}
	// First the API's limit stops the agent; after its 200th request its
	// own hourly limit does too, and the 429 names the later of the two.
	for scope, want := range map[string]struct {
		limit  string
		window int
	}{"api": {"60", 60}, "agent": {"200", 3600}} {
		r, found := samples[scope]
		if !found {
			t.Fatalf("no 429 for the %s limit among %v", scope, samples)
		}
		if r.errorCode(t) != "rate_limited" || r.header.Get("X-RateLimit-Limit") != want.limit || r.header.Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("%s 429 headers %v", scope, r.header)
		}
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > want.window {
			t.Fatalf("%s Retry-After %q", scope, r.header.Get("Retry-After"))
		}
		if reset, err := strconv.ParseInt(r.header.Get("X-RateLimit-Reset"), 10, 64); err != nil || reset%int64(want.window) != 0 {
			t.Fatalf("%s X-RateLimit-Reset %q", scope, r.header.Get("X-RateLimit-Reset"))
		}
	}
}

func TestComplianceSwitchesFromConfigDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeConfig(t, dir, "strict_mode: true", "strict_mode: false")
	e := newEnv(t, func(c *service.Config) { c.ConfigDir = dir })
	req := librarianApproval()
	req["deviations"] = []any{map[string]any{"standard": "naming", "reason": "legacy"}}
	if resp := e.do(t, "POST", "/agent/request", claudeToken, req).response(t); resp.Status != "escalated" {
		t.Fatalf("a deviation outside strict mode: %v", resp)
	}
	bad := t.TempDir()
	writeConfig(t, bad, "max_references: 20", "max_references: lots")
	_, err := service.NewHandler(service.Config{ConfigDir: bad, APIRate: "60/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second}, service.Deps{})
	if err == nil || !strings.Contains(err.Error(), bad+"/protocol.yaml") {
		t.Fatalf("a bad protocol.yaml: %v", err)
	}
}

// TestReadLimit: reads have their own budget per caller; past it, 429 with
// the read limit's headers, and another caller is not affected.
func TestReadLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *service.Config) { c.ReadRate = "3/minute" })
	for i := range 3 {
		if r := e.do(t, "GET", "/agent/capabilities", copilotToken, nil); r.status != 200 {
			t.Fatalf("read %d: %d", i, r.status)
		}
	}
	r := e.do(t, "GET", "/agent/capabilities", copilotToken, nil)
	if r.status != 429 || r.errorCode(t) != "rate_limited" || r.header.Get("X-RateLimit-Scope") != "read" || r.header.Get("X-RateLimit-Limit") != "3" || r.header.Get("Retry-After") == "" {
		t.Fatalf("fourth read: %d %v %s", r.status, r.header, r.body)
	}
	if r := e.do(t, "GET", "/agent/capabilities", claudeToken, nil); r.status != 200 {
		t.Fatalf("another agent's read: %d", r.status)
	}
}

// TestNewChecksConfig: New and NewHandler refuse a Config that Validate
// refuses, before they use any of its Deps, with the error naming the
// setting.
func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	cfg := service.Config{HTTPAddr: "127.0.0.1:0", APIRate: "60/minute", ReadRate: "600/minute"}
	const want = "CONCLAVE_LIBRARIAN_SHUTDOWN_TIMEOUT: must be positive"
	if _, err := service.New(cfg, service.Deps{}); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("New = %v, want %s", err, want)
	}
	if _, err := service.NewHandler(cfg, service.Deps{}); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("NewHandler = %v, want %s", err, want)
	}
}
