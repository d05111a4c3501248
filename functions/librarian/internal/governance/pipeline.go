package governance

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// Verdict is what one rule concluded.
type Verdict int

// A rule passes, warns (the request goes on with lower confidence), or
// ends the pipeline with one of the others.
const (
	Pass Verdict = iota
	Warn
	Reject
	Escalate
	Clarify
	// Deny ends the request with an HTTP error (403, 429) rather than a
	// decision: the agent was not allowed to ask.
	Deny
)

func (v Verdict) String() string {
	return [...]string{"pass", "warn", "reject", "escalate", "clarify", "deny"}[v]
}

// Outcome is one rule's result.
type Outcome struct {
	Verdict     Verdict
	Violations  []*librarianv1.ViolationDetail
	Suggestions []string
	Constraints []string
	// Reason explains an Escalate, Clarify or Deny.
	Reason string
	// Denial is set with Deny.
	Denial *Denial
}

// Denial is a request refused before it was decided.
type Denial struct {
	// Status is 401, 403 or 429.
	Status int
	Code   string
	Reason string
	// Allowance is the exhausted rate limit, for 429's headers.
	Allowance *Allowance
}

func (d *Denial) Error() string { return d.Reason }

// Allowance is the state of one rate limit after counting a request.
type Allowance struct {
	// Name says which limit: "api" (60/minute) or "agent" (the registry's).
	Name      string
	Limit     int
	Remaining int
	Reset     time.Time
	Allowed   bool
}

// Graph is what the rules ask the knowledge graph.
type Graph interface {
	// Missing returns the ids that are not nodes.
	Missing(ctx context.Context, ids []string) ([]string, error)
	// Resolve returns the id of the node with this id or path, or "".
	Resolve(ctx context.Context, id, path string) (string, error)
	// Cycle returns a cycle, as node ids from start back to start, that
	// edges start → each of refs would close, or nil.
	Cycle(ctx context.Context, start string, refs []string) ([]string, error)
}

// Limiter counts a request against an agent's limits.
type Limiter interface {
	// Take counts one request and returns every limit's allowance; the
	// request may proceed when all are Allowed.
	Take(ctx context.Context, agent policy.Agent) ([]Allowance, error)
}

// Requests answers who owns a stored request.
type Requests interface {
	// Owner returns the agent that submitted requestID, and whether the
	// request exists.
	Owner(ctx context.Context, requestID string) (string, bool, error)
}

// Templates are the content formats per target type.
type Templates interface {
	// Template returns the format content of targetType must follow, if any.
	Template(targetType string) (Template, bool)
}

// Input is what the pipeline decides on. Rules may fill Subject and
// Location for the rules after them.
type Input struct {
	Request  *librarianv1.AgentRequest
	Agent    policy.Agent
	Protocol policy.Protocol
	// Subject is the graph node the request is about: the target of a
	// modify or delete, the id assigned to a create.
	Subject string
	// Location is where an approved create goes.
	Location string
}

// Rule is one step of the pipeline.
type Rule interface {
	Name() string
	Check(ctx context.Context, in *Input) (Outcome, error)
}

// RuleResult is one rule's line in a decision's record.
type RuleResult struct {
	Rule    string  `json:"rule"`
	Verdict string  `json:"verdict"`
	Detail  string  `json:"detail,omitempty"`
	Millis  float64 `json:"ms"`
}

// Decision is the pipeline's answer.
type Decision struct {
	State            State
	Confidence       float64
	Feedback         string
	Violations       []*librarianv1.ViolationDetail
	Suggestions      []string
	Constraints      []string
	EscalationReason string
	Subject          string
	Location         string
	Results          []RuleResult
}

// Pipeline runs rules in order and stops at the first that does not pass
// or warn, as the protocol's ProtocolValidator does.
type Pipeline struct {
	rules []Rule
}

// Deps are what the protocol's rules consult.
type Deps struct {
	Graph     Graph
	Limiter   Limiter
	Requests  Requests
	Templates Templates
}

// NewPipeline returns the protocol's rules in its order, then the Librarian's
// own: dependency cycles, then deviations and risk.
func NewPipeline(d Deps) *Pipeline {
	return &Pipeline{rules: []Rule{
		RequiredFields{},
		Authorization{Requests: d.Requests},
		RateLimits{Limiter: d.Limiter},
		ContentFormat{Templates: d.Templates},
		References{Graph: d.Graph},
		TargetExists{Graph: d.Graph},
		DependencyCycle{Graph: d.Graph},
		DeviationsAndRisk{},
	}}
}

// Rules lists the pipeline's rule names in order.
func (p *Pipeline) Rules() []string {
	names := make([]string, len(p.rules))
	for i, r := range p.rules {
		names[i] = r.Name()
	}
	return names
}

// Confidence each verdict contributes; the decision's is their product.
var confidence = map[Verdict]float64{Pass: 1, Warn: 0.85, Reject: 1, Escalate: 0.5, Clarify: 0.4, Deny: 1}

// Decide runs the pipeline. A *Denial error means the request is refused
// with its HTTP status; another error means a dependency failed.
func (p *Pipeline) Decide(ctx context.Context, in *Input) (Decision, error) {
	d := Decision{State: Approved, Confidence: 1}
	var warnings []string
	for _, rule := range p.rules {
		start := time.Now()
		out, err := rule.Check(ctx, in)
		if err != nil {
			return d, fmt.Errorf("rule %s: %w", rule.Name(), err)
		}
		d.Results = append(d.Results, RuleResult{Rule: rule.Name(), Verdict: out.Verdict.String(), Detail: out.detail(),
			Millis: float64(time.Since(start).Microseconds()) / 1000})
		d.Confidence *= confidence[out.Verdict]
		d.Violations = append(d.Violations, out.Violations...)
		d.Suggestions = append(d.Suggestions, out.Suggestions...)
		d.Constraints = append(d.Constraints, out.Constraints...)
		switch out.Verdict {
		case Pass:
			continue
		case Warn:
			warnings = append(warnings, out.detail())
			continue
		case Deny:
			return d, out.Denial
		case Reject:
			d.State = Rejected
			d.Feedback = fmt.Sprintf("Rejected by rule %s: %s", rule.Name(), out.detail())
		case Escalate:
			d.State = Escalated
			d.EscalationReason = out.Reason
			d.Feedback = "Escalated for human review: " + out.Reason
		case Clarify:
			d.State = ClarificationNeeded
			d.Feedback = "Clarification needed: " + out.Reason
		}
		d.Subject, d.Location = in.Subject, in.Location
		return d, nil
	}
	d.Subject, d.Location = in.Subject, in.Location
	d.Feedback = "Approved: every rule passed."
	if len(warnings) > 0 {
		d.Feedback = "Approved with warnings: " + strings.Join(warnings, "; ")
	}
	return d, nil
}

func (o Outcome) detail() string {
	if o.Reason != "" {
		return o.Reason
	}
	parts := make([]string, 0, len(o.Violations))
	for _, v := range o.Violations {
		parts = append(parts, v.GetDescription())
	}
	return strings.Join(parts, "; ")
}

func violation(rule, field, severity, format string, args ...any) *librarianv1.ViolationDetail {
	return &librarianv1.ViolationDetail{Rule: rule, Field: field, Severity: severity, Description: fmt.Sprintf(format, args...)}
}

func deny(status int, code, format string, args ...any) Outcome {
	reason := fmt.Sprintf(format, args...)
	return Outcome{Verdict: Deny, Reason: reason, Denial: &Denial{Status: status, Code: code, Reason: reason}}
}
