package governance_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/conclave-ai/conclave/functions/librarian/config"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/functions/librarian/templates"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// graph is an in-memory knowledge graph for the rules' unit tests: node ids
// with their paths and depends-on edges.
type graph struct {
	paths map[string]string   // id → path
	edges map[string][]string // id → ids it depends on
}

func (g graph) Missing(_ context.Context, ids []string) ([]string, error) {
	var missing []string
	for _, id := range ids {
		if _, ok := g.paths[id]; !ok {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

func (g graph) Resolve(_ context.Context, id, path string) (string, error) {
	for nid, p := range g.paths {
		if (id != "" && nid == id) || (path != "" && p == path) {
			return nid, nil
		}
	}
	return "", nil
}

func (g graph) Cycle(_ context.Context, start string, refs []string) ([]string, error) {
	var walk func(at string, seen []string) []string
	walk = func(at string, seen []string) []string {
		if at == start {
			return append(seen, at)
		}
		if slices.Contains(seen, at) {
			return nil
		}
		for _, next := range g.edges[at] {
			if c := walk(next, append(seen, at)); c != nil {
				return c
			}
		}
		return nil
	}
	for _, r := range refs {
		if c := walk(r, []string{start}); c != nil {
			return c, nil
		}
	}
	return nil, nil
}

type limiter struct{ exhausted bool }

func (l limiter) Take(context.Context, policy.Agent) ([]governance.Allowance, error) {
	reset := time.Date(2026, 1, 1, 12, 1, 0, 0, time.UTC)
	return []governance.Allowance{
		{Name: "api", Limit: 60, Remaining: 59, Reset: reset, Allowed: true},
		{Name: "agent", Limit: 100, Remaining: 0, Reset: reset.Add(time.Hour), Allowed: !l.exhausted},
	}, nil
}

type owners map[string]string

func (o owners) Owner(_ context.Context, id string) (string, bool, error) {
	a, ok := o[id]
	return a, ok, nil
}

type failingGraph struct{ graph }

func (failingGraph) Missing(context.Context, []string) ([]string, error) {
	return nil, errors.New("store unreachable")
}

const goodDesign = "# Login flow\n\n## Overview\nx\n\n## Design\ny\n\n## Alternatives\nz\n"

func TestPipelineDecisions(t *testing.T) {
	t.Parallel()
	pol, err := policy.Load(config.Files, "config")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := templates.Load()
	if err != nil {
		t.Fatal(err)
	}
	g := graph{
		paths: map[string]string{"arch-001": "docs/architecture/overview.md", "req-045": "docs/requirements.md", "design-a": "docs/design/a.md", "design-b": "docs/design/b.md"},
		edges: map[string][]string{"design-b": {"design-a"}},
	}
	approval := func(mod func(r *librarianv1.AgentRequest)) *librarianv1.AgentRequest {
		r := &librarianv1.AgentRequest{AgentId: "claude-3", SessionId: "sess-123", RequestType: "APPROVAL", Action: "create",
			TargetType: "design", TargetPath: proto.String("docs/design/new-feature.md"), Content: goodDesign,
			Rationale: "Implementing user story US-123", References: []string{"arch-001", "req-045"}}
		if mod != nil {
			mod(r)
		}
		return r
	}
	deviation, _ := structpb.NewStruct(map[string]any{"standard": "naming", "reason": "legacy API"})
	compliance := func(mod func(c *policy.Compliance)) policy.Protocol {
		p := pol.Protocol
		mod(&p.Compliance)
		return p
	}
	tests := []struct {
		name       string
		agent      string
		protocol   *policy.Protocol
		limited    bool
		req        *librarianv1.AgentRequest
		wantState  governance.State
		wantDeny   int
		wantRule   string // a violation's rule, or the feedback's
		wantSubj   string
		wantLoc    string
		confidence float64
	}{
		{name: "protocol example approved", req: approval(nil), wantState: governance.Approved,
			wantSubj: governance.AssignID("design", "docs/design/new-feature.md"), wantLoc: "docs/design/new-feature.md", confidence: 1},
		{name: "create without path goes to the default location", req: approval(func(r *librarianv1.AgentRequest) { r.TargetPath = nil }),
			wantState: governance.Approved, wantLoc: "docs/design/login-flow.md", confidence: 1},
		{name: "missing rationale", req: approval(func(r *librarianv1.AgentRequest) { r.Rationale = "" }), wantState: governance.Rejected, wantRule: "required_fields"},
		{name: "rationale optional when not required", protocol: ptr(compliance(func(c *policy.Compliance) { c.RequireRationale = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.Rationale = "" }), wantState: governance.Approved, confidence: 1},
		{name: "query needs content", req: &librarianv1.AgentRequest{AgentId: "copilot-2", RequestType: "QUERY"}, agent: "copilot-2", wantState: governance.Rejected, wantRule: "required_fields"},
		{name: "report needs its fields", req: &librarianv1.AgentRequest{AgentId: "claude-3", RequestType: "REPORT"}, wantState: governance.Rejected, wantRule: "required_fields"},
		{name: "no write capability", agent: "gemini-pro", req: approval(func(r *librarianv1.AgentRequest) { r.AgentId = "gemini-pro" }), wantDeny: http.StatusForbidden},
		{name: "target not allowed", req: approval(func(r *librarianv1.AgentRequest) { r.TargetType = "docs" }), wantDeny: http.StatusForbidden},
		{name: "report on another agent's request", req: &librarianv1.AgentRequest{AgentId: "claude-3", RequestType: "REPORT", RequestId: "req-of-copilot", Completed: proto.Bool(true), ChangesMade: []string{"x"}},
			wantDeny: http.StatusForbidden},
		{name: "report on an unknown request", req: &librarianv1.AgentRequest{AgentId: "claude-3", RequestType: "REPORT", RequestId: "nope", Completed: proto.Bool(true), ChangesMade: []string{"x"}},
			wantDeny: http.StatusNotFound},
		{name: "report on own request", req: &librarianv1.AgentRequest{AgentId: "claude-3", RequestType: "REPORT", RequestId: "req-of-claude", Completed: proto.Bool(true), ChangesMade: []string{"x"}},
			wantState: governance.Approved, confidence: 1},
		{name: "rate limited", limited: true, req: approval(nil), wantDeny: http.StatusTooManyRequests},
		{name: "format violation rejects in strict mode", req: approval(func(r *librarianv1.AgentRequest) { r.Content = "# Title\n\n## Overview\n" }),
			wantState: governance.Rejected, wantRule: "content_format"},
		{name: "format violation warns otherwise", protocol: ptr(compliance(func(c *policy.Compliance) { c.StrictMode = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.Content = "# Title\n\n## Overview\n" }), wantState: governance.Approved, wantRule: "content_format", confidence: 0.85},
		{name: "code has no template", req: approval(func(r *librarianv1.AgentRequest) {
			r.TargetType, r.TargetPath, r.Content = "code", proto.String("pkg/x/x.go"), "package x"
		}), wantState: governance.Approved, confidence: 1},
		{name: "NUL bytes", req: approval(func(r *librarianv1.AgentRequest) { r.Content = goodDesign + "\x00" }), wantState: governance.Rejected, wantRule: "content_format"},
		{name: "unknown reference rejects when enforced", req: approval(func(r *librarianv1.AgentRequest) { r.References = []string{"arch-001", "arch-999"} }),
			wantState: governance.Rejected, wantRule: "invalid_reference"},
		{name: "unknown reference warns otherwise", protocol: ptr(compliance(func(c *policy.Compliance) { c.EnforceReferences = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.References = []string{"arch-999"} }), wantState: governance.Approved, wantRule: "invalid_reference", confidence: 0.85},
		{name: "create over an existing path", req: approval(func(r *librarianv1.AgentRequest) { r.TargetPath = proto.String("docs/design/a.md") }),
			wantState: governance.Rejected, wantRule: "target_exists"},
		{name: "modify a missing target", req: approval(func(r *librarianv1.AgentRequest) { r.Action, r.TargetId = "modify", proto.String("design-zzz") }),
			wantState: governance.Rejected, wantRule: "target_exists"},
		{name: "modify without a target is ambiguous", req: approval(func(r *librarianv1.AgentRequest) { r.Action, r.TargetPath = "modify", nil }),
			wantState: governance.ClarificationNeeded, confidence: 0.4},
		{name: "code create without a path is ambiguous", req: approval(func(r *librarianv1.AgentRequest) { r.TargetType, r.TargetPath, r.Content = "code", nil, "package x" }),
			wantState: governance.ClarificationNeeded},
		{name: "unknown targets pass without require_known_targets", protocol: ptr(compliance(func(c *policy.Compliance) { c.RequireKnownTargets = false })),
			req: approval(func(r *librarianv1.AgentRequest) {
				r.Action, r.TargetType, r.TargetPath, r.Content = "modify", "code", proto.String("cmd/main.go"), "edit main"
			}), wantState: governance.Approved, wantLoc: "cmd/main.go", confidence: 1},
		{name: "no target passes without require_known_targets", protocol: ptr(compliance(func(c *policy.Compliance) { c.RequireKnownTargets = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.Action, r.TargetPath = "modify", nil }), wantState: governance.Approved, confidence: 1},
		{name: "a code create without a path passes without require_known_targets", protocol: ptr(compliance(func(c *policy.Compliance) { c.RequireKnownTargets = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.TargetType, r.TargetPath, r.Content = "code", nil, "package x" }), wantState: governance.Approved, confidence: 1},
		{name: "then a deviation escalates when not strict", protocol: ptr(compliance(func(c *policy.Compliance) { c.RequireKnownTargets, c.StrictMode = false, false })),
			req: approval(func(r *librarianv1.AgentRequest) {
				r.Action, r.TargetPath, r.Deviations = "modify", nil, []*structpb.Struct{deviation}
			}), wantState: governance.Escalated},
		{name: "but a create over an existing path is still rejected", protocol: ptr(compliance(func(c *policy.Compliance) { c.RequireKnownTargets = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.TargetPath = proto.String("docs/design/a.md") }), wantState: governance.Rejected, wantRule: "target_exists"},
		{name: "modify an existing target", req: approval(func(r *librarianv1.AgentRequest) { r.Action, r.TargetPath = "modify", proto.String("docs/design/a.md") }),
			wantState: governance.Approved, wantSubj: "design-a", confidence: 1},
		{name: "a cycle is rejected with its path", req: approval(func(r *librarianv1.AgentRequest) {
			r.Action, r.TargetId, r.TargetPath, r.References = "modify", proto.String("design-a"), nil, []string{"design-b"}
		}), wantState: governance.Rejected, wantRule: "circular_dependency"},
		{name: "a cycle through depends_on is rejected with its path", req: approval(func(r *librarianv1.AgentRequest) {
			r.Action, r.TargetId, r.TargetPath, r.References, r.DependsOn = "modify", proto.String("design-a"), nil, nil, []string{"design-b"}
		}), wantState: governance.Rejected, wantRule: "circular_dependency"},
		{name: "depends_on an existing node", req: approval(func(r *librarianv1.AgentRequest) { r.DependsOn = []string{"design-b"} }),
			wantState: governance.Approved, confidence: 1},
		{name: "depends_on a missing node under enforce_references", req: approval(func(r *librarianv1.AgentRequest) { r.DependsOn = []string{"design-zzz"} }),
			wantState: governance.Rejected, wantRule: "invalid_dependency"},
		{name: "depends_on a missing node warns otherwise", protocol: ptr(compliance(func(c *policy.Compliance) { c.EnforceReferences = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.DependsOn = []string{"design-zzz"} }), wantState: governance.Approved, confidence: 0.85},
		{name: "deviations rejected in strict mode", req: approval(func(r *librarianv1.AgentRequest) { r.Deviations = []*structpb.Struct{deviation} }),
			wantState: governance.Rejected, wantRule: "deviations_not_allowed"},
		{name: "deviations escalated when not strict", protocol: ptr(compliance(func(c *policy.Compliance) { c.StrictMode = false })),
			req: approval(func(r *librarianv1.AgentRequest) { r.Deviations = []*structpb.Struct{deviation} }), wantState: governance.Escalated, confidence: 0.5},
		{name: "deviations accepted as constraints", protocol: ptr(compliance(func(c *policy.Compliance) { c.AllowDeviations = true })),
			req: approval(func(r *librarianv1.AgentRequest) { r.Deviations = []*structpb.Struct{deviation} }), wantState: governance.Approved, confidence: 1},
		{name: "high risk escalates", req: approval(func(r *librarianv1.AgentRequest) { r.RiskAssessment = proto.String("High: touches auth") }), wantState: governance.Escalated},
		{name: "deleting a design escalates", req: approval(func(r *librarianv1.AgentRequest) {
			r.Action, r.TargetPath, r.References = "delete", proto.String("docs/design/a.md"), nil
		}), wantState: governance.Escalated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			agentID := tt.agent
			if agentID == "" {
				agentID = "claude-3"
			}
			agent, _ := pol.Agent(agentID)
			protocol := pol.Protocol
			if tt.protocol != nil {
				protocol = *tt.protocol
			}
			p := governance.NewPipeline(governance.Deps{Graph: g, Limiter: limiter{exhausted: tt.limited},
				Requests: owners{"req-of-copilot": "copilot-2", "req-of-claude": "claude-3"}, Templates: tpl})
			d, err := p.Decide(context.Background(), &governance.Input{Request: tt.req, Agent: agent, Protocol: protocol})
			if tt.wantDeny != 0 {
				var denial *governance.Denial
				if !errors.As(err, &denial) || denial.Status != tt.wantDeny || denial.Reason == "" {
					t.Fatalf("got %v (%+v), want a %d denial", err, d, tt.wantDeny)
				}
				if tt.wantDeny == http.StatusTooManyRequests && (denial.Allowance == nil || denial.Allowance.Name != "agent") {
					t.Fatalf("429 without the exhausted limit: %+v", denial.Allowance)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.State != tt.wantState {
				t.Fatalf("state %s, want %s: %s %v", d.State, tt.wantState, d.Feedback, d.Violations)
			}
			if tt.wantRule != "" && !slices.ContainsFunc(d.Violations, func(v *librarianv1.ViolationDetail) bool { return v.Rule == tt.wantRule }) {
				t.Fatalf("no %s violation in %v", tt.wantRule, d.Violations)
			}
			if d.State == governance.Rejected && len(d.Suggestions) == 0 {
				t.Fatalf("a rejection without suggestions: %+v", d)
			}
			if d.State == governance.Escalated && d.EscalationReason == "" {
				t.Fatal("an escalation without a reason")
			}
			if tt.wantSubj != "" && d.Subject != tt.wantSubj {
				t.Fatalf("subject %q, want %q", d.Subject, tt.wantSubj)
			}
			if tt.wantLoc != "" && d.Location != tt.wantLoc {
				t.Fatalf("location %q, want %q", d.Location, tt.wantLoc)
			}
			if tt.confidence != 0 && d.Confidence != tt.confidence {
				t.Fatalf("confidence %g, want %g", d.Confidence, tt.confidence)
			}
			if strings.HasPrefix(tt.name, "a cycle") && !strings.Contains(d.Feedback, "design-a → design-b → design-a") {
				t.Fatalf("feedback %q does not show the cycle", d.Feedback)
			}
			if tt.name == "a cycle through depends_on is rejected with its path" && d.Violations[0].GetField() != "depends_on" {
				t.Fatalf("the cycle's violation names field %q, want depends_on", d.Violations[0].GetField())
			}
			if tt.name == "deviations accepted as constraints" && len(d.Constraints) != 1 {
				t.Fatalf("constraints %v", d.Constraints)
			}
		})
	}
}

func TestPipelineStopsOnDependencyFailure(t *testing.T) {
	t.Parallel()
	pol, _ := policy.Load(config.Files, "config")
	tpl, _ := templates.Load()
	agent, _ := pol.Agent("claude-3")
	p := governance.NewPipeline(governance.Deps{Graph: failingGraph{}, Limiter: limiter{}, Requests: owners{}, Templates: tpl})
	_, err := p.Decide(context.Background(), &governance.Input{Agent: agent, Protocol: pol.Protocol, Request: &librarianv1.AgentRequest{
		AgentId: "claude-3", RequestType: "QUERY", Content: "auth?", References: []string{"x"}}})
	if err == nil || !strings.Contains(err.Error(), "rule references: store unreachable") {
		t.Fatalf("err = %v", err)
	}
	if got := p.Rules(); len(got) != 8 || got[0] != "required_fields" || got[2] != "rate_limits" {
		t.Fatalf("rules %v are not the protocol's order", got)
	}
}

func ptr[T any](v T) *T { return &v }

func TestCheckShape(t *testing.T) {
	t.Parallel()
	limits := policy.Limits{MaxContentSize: 100, MaxReferences: 2, MaxDeviations: 1}
	dev, _ := structpb.NewStruct(map[string]any{"a": "b"})
	nonString, _ := structpb.NewStruct(map[string]any{"a": 1.0})
	tests := []struct {
		name   string
		req    *librarianv1.AgentRequest
		status int
		code   string
	}{
		{"fine", &librarianv1.AgentRequest{RequestType: "QUERY", Content: "x", TargetPath: proto.String("docs/a.md"), Deviations: []*structpb.Struct{dev}}, 0, ""},
		{"request type", &librarianv1.AgentRequest{RequestType: "PLEASE"}, 400, "unknown_request_type"},
		{"action", &librarianv1.AgentRequest{Action: "explode"}, 400, "unknown_action"},
		{"target type", &librarianv1.AgentRequest{TargetType: "kitchen"}, 400, "unknown_target_type"},
		{"traversal", &librarianv1.AgentRequest{TargetPath: proto.String("docs/../../etc/passwd")}, 400, "invalid_target_path"},
		{"absolute", &librarianv1.AgentRequest{TargetPath: proto.String("/etc/passwd")}, 400, "invalid_target_path"},
		{"windows", &librarianv1.AgentRequest{TargetPath: proto.String(`C:\x`)}, 400, "invalid_target_path"},
		{"unclean", &librarianv1.AgentRequest{TargetPath: proto.String("docs//a.md")}, 400, "invalid_target_path"},
		{"control", &librarianv1.AgentRequest{TargetPath: proto.String("docs/a\n.md")}, 400, "invalid_target_path"},
		{"empty path", &librarianv1.AgentRequest{TargetPath: proto.String("")}, 400, "invalid_target_path"},
		{"content", &librarianv1.AgentRequest{Content: strings.Repeat("x", 101)}, 413, "content_too_large"},
		{"references", &librarianv1.AgentRequest{References: []string{"a", "b", "c"}}, 400, "too_many_references"},
		{"deviations", &librarianv1.AgentRequest{Deviations: []*structpb.Struct{dev, dev}}, 400, "too_many_deviations"},
		{"non-string deviation", &librarianv1.AgentRequest{Deviations: []*structpb.Struct{nonString}}, 400, "invalid_deviation"},
		{"empty reference", &librarianv1.AgentRequest{References: []string{""}}, 400, "invalid_entry"},
		{"dependencies", &librarianv1.AgentRequest{DependsOn: []string{"a", "b", "c"}}, 400, "too_many_dependencies"},
		{"empty dependency", &librarianv1.AgentRequest{DependsOn: []string{""}}, 400, "invalid_entry"},
		{"long id", &librarianv1.AgentRequest{SessionId: strings.Repeat("s", 200)}, 400, "field_too_long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := governance.CheckShape(tt.req, limits)
			if tt.status == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || err.Status != tt.status || err.Code != tt.code || err.Field == "" {
				t.Fatalf("got %+v, want %d %s", err, tt.status, tt.code)
			}
		})
	}
}

func TestSlugAndIDs(t *testing.T) {
	t.Parallel()
	if got := governance.Slug("  Login: the NEW flow (v2)! "); got != "login-the-new-flow-v2" {
		t.Fatalf("slug %q", got)
	}
	if a, b := governance.AssignID("architecture", "x"), governance.AssignID("architecture", "x"); a != b || !strings.HasPrefix(a, "arch-") {
		t.Fatalf("ids %q %q", a, b)
	}
}

type tiedLimiter struct{}

func (tiedLimiter) Take(context.Context, policy.Agent) ([]governance.Allowance, error) {
	reset := time.Date(2026, 1, 1, 13, 0, 0, 0, time.UTC)
	return []governance.Allowance{{Name: "api", Limit: 60, Reset: reset}, {Name: "agent", Limit: 100, Reset: reset}}, nil
}

// TestRateLimitTie: when the minute and the hour end together, the 429
// names the agent's own limit, whatever the timing.
func TestRateLimitTie(t *testing.T) {
	t.Parallel()
	out, err := governance.RateLimits{Limiter: tiedLimiter{}}.Check(context.Background(), &governance.Input{})
	if err != nil || out.Denial == nil || out.Denial.Allowance.Name != "agent" {
		t.Fatalf("%+v %v", out.Denial, err)
	}
}
