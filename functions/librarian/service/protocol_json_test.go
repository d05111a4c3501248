package service_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// The Librarian's answers as a client written from its protocol reads
// them: LibrarianResponse as the Librarian protocol writes it (a Python dataclass: int
// and float are JSON numbers, List a list, Optional may be null or absent),
// and the types the protocol names without spelling out as docs/librarian.md
// ("JSON types") does. None of these comes from our protos.
type (
	protoViolation struct {
		Rule        string `json:"rule"`
		Description string `json:"description"`
		Severity    string `json:"severity"`
		Field       string `json:"field"`
	}
	protoNode struct {
		ID    string `json:"id"`
		Type  string `json:"type"`
		Title string `json:"title"`
		Path  string `json:"path"`
	}
	protoResponse struct {
		RequestID           string           `json:"request_id"`
		Timestamp           time.Time        `json:"timestamp"`
		ProcessingTimeMS    int              `json:"processing_time_ms"`
		Status              string           `json:"status"`
		Confidence          float64          `json:"confidence"`
		Feedback            string           `json:"feedback"`
		Violations          []protoViolation `json:"violations"`
		Suggestions         []string         `json:"suggestions"`
		ApprovedLocation    *string          `json:"approved_location"`
		AssignedID          *string          `json:"assigned_id"`
		Constraints         []string         `json:"constraints"`
		EscalationReason    *string          `json:"escalation_reason"`
		HumanReviewURL      *string          `json:"human_review_url"`
		EstimatedReviewTime *int             `json:"estimated_review_time"`
		Context             *map[string]any  `json:"context"`
		RelevantNodes       *[]protoNode     `json:"relevant_nodes"`
	}
	protoStatus struct {
		RequestID string         `json:"request_id"`
		Status    string         `json:"status"`
		UpdatedAt time.Time      `json:"updated_at"`
		Response  *protoResponse `json:"response"`
	}
	protoContext struct {
		Nodes   []protoNode     `json:"nodes"`
		Context *map[string]any `json:"context"`
	}
	protoCapabilities struct {
		AgentID             string   `json:"agent_id"`
		AgentType           string   `json:"agent_type"`
		Capabilities        []string `json:"capabilities"`
		RateLimit           string   `json:"rate_limit"`
		MaxRequestSizeBytes int      `json:"max_request_size_bytes"`
		AllowedTargets      []string `json:"allowed_targets"`
	}
	protoEscalated struct {
		Requests []protoStatus `json:"requests"`
	}
	protoDecided struct {
		Requests []struct {
			RequestID string      `json:"request_id"`
			AgentID   string      `json:"agent_id"`
			Decision  string      `json:"decision"`
			DecidedAt time.Time   `json:"decided_at"`
			DecidedBy string      `json:"decided_by"`
			Reviewer  string      `json:"reviewer"`
			Comment   string      `json:"comment"`
			Request   protoStatus `json:"request"`
		} `json:"requests"`
		NextPageToken string `json:"next_page_token"`
	}
)

// TestJSONTypesAsTheProtocolStates decodes every kind of answer strictly
// into the protocol's types: numbers as numbers (processing_time_ms was a
// string), lists present as [] when empty (violations, suggestions and
// constraints were left out), no member the protocol does not list.
func TestJSONTypesAsTheProtocolStates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	get := func(method, path, token string, body any, into any) []byte {
		t.Helper()
		r := e.do(t, method, path, token, body)
		if r.status != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, r.status, r.body)
		}
		if err := testenv.DecodeProtocol(r.body, into); err != nil {
			t.Errorf("%s %s: %v", method, path, err)
		}
		return r.body
	}

	// Approved, with nothing to report: the empty lists are there.
	var approved protoResponse
	raw := get("POST", "/agent/request", claudeToken, librarianApproval(), &approved)
	var members map[string]any
	if err := json.Unmarshal(raw, &members); err != nil {
		t.Fatal(err)
	}
	if _, ok := members["processing_time_ms"].(float64); !ok {
		t.Errorf("processing_time_ms is %T in %s, want a number", members["processing_time_ms"], raw)
	}
	for _, list := range []string{"violations", "suggestions", "constraints"} {
		if _, ok := members[list].([]any); !ok {
			t.Errorf("%s is %T in %s, want a list", list, members[list], raw)
		}
	}
	if approved.Status != "approved" || approved.AssignedID == nil || approved.ApprovedLocation == nil {
		t.Errorf("approval %+v", approved)
	}

	// Rejected (no rationale), escalated, a query.
	var rejected protoResponse
	get("POST", "/agent/request", claudeToken, map[string]any{"request_type": "APPROVAL", "action": "create", "target_type": "design", "content": "# x"}, &rejected)
	if rejected.Status != "rejected" || len(rejected.Violations) == 0 || rejected.AssignedID != nil {
		t.Errorf("rejection %+v", rejected)
	}
	req := librarianApproval()
	req["target_path"] = "docs/design/risky.md"
	req["risk_assessment"] = "high: changes the authentication flow"
	var escalated protoResponse
	get("POST", "/agent/request", claudeToken, req, &escalated)
	if escalated.Status != "escalated" || escalated.EstimatedReviewTime == nil || *escalated.EstimatedReviewTime != 1440 || escalated.HumanReviewURL == nil {
		t.Errorf("escalation %+v", escalated)
	}
	var query protoResponse
	get("POST", "/agent/request", copilotToken, map[string]any{"agent_id": "copilot-2", "request_type": "QUERY",
		"content": "What are the current authentication requirements?"}, &query)
	if query.RelevantNodes == nil || len(*query.RelevantNodes) == 0 || query.Context == nil {
		t.Errorf("query %+v", query)
	}

	// The other endpoints.
	var st protoStatus
	get("GET", "/agent/status/"+approved.RequestID, claudeToken, nil, &st)
	if st.Response == nil || st.Response.RequestID != approved.RequestID {
		t.Errorf("status %+v", st)
	}
	get("POST", "/agent/context", geminiToken, map[string]any{"query": "OAuth"}, &protoContext{})
	var caps protoCapabilities
	get("GET", "/agent/capabilities", copilotToken, nil, &caps)
	if caps.MaxRequestSizeBytes != 10<<10 {
		t.Errorf("capabilities %+v", caps)
	}
	var waiting protoEscalated
	get("GET", "/reviews?status=escalated", reviewerToken, nil, &waiting)
	if len(waiting.Requests) != 1 {
		t.Errorf("escalated list %+v", waiting)
	}
	get("POST", "/reviews/"+escalated.RequestID+"/decision", reviewerToken, map[string]any{"decision": "approve", "comment": "fine"}, &protoStatus{})
	var decided protoDecided
	get("GET", "/reviews?status=decided", reviewerToken, nil, &decided)
	if len(decided.Requests) < 2 {
		t.Errorf("decided list %+v", decided)
	}
}
