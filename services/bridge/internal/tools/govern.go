package tools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/govern"
	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
	"github.com/conclave-ai/conclave/services/bridge/internal/agentconfig"
)

// Governor asks the Librarian and waits for a person's decision on what it
// escalates (pkg/govern).
type Governor interface {
	Ask(ctx context.Context, a govern.Ask) govern.Outcome
}

// Governance is what governed tools ask the Librarian with.
type Governance struct {
	Governor Governor
	// AgentID is the bridge's agent_id in the Librarian's registry: every
	// governed tool asks as it.
	AgentID string
}

// SetGovernance makes governed tools ask g before they run; without it
// they are refused (failing closed).
func (r *Runner) SetGovernance(g Governance) { r.gov = g }

// maxGovernedContent bounds a call's parameters in the request's content.
const maxGovernedContent = 32 << 10

// approve asks the Librarian about a call of a governed tool: nil when it
// approves, else a KindNotApproved error naming the decision (the agent is
// then never run).
func (r *Runner) approve(ctx context.Context, a *agentconfig.Agent, params map[string]any, args json.RawMessage) error {
	if r.gov.Governor == nil {
		return notApproved(a, govern.Outcome{Decision: govern.Unavailable, Reason: "no Librarian is configured (CONCLAVE_BRIDGE_LIBRARIAN_URL)"})
	}
	raw := string(orEmptyObject(args))
	if len(raw) > maxGovernedContent {
		raw = raw[:maxGovernedContent] + "…"
	}
	req := &librarianv1.AgentRequest{
		AgentId: r.gov.AgentID, SessionId: "bridge", RequestType: "APPROVAL", Action: "modify", TargetType: "code",
		Content:     fmt.Sprintf("Tool call: %s\nDescription: %s\nParameters: %s\n", a.Name, a.Description, strings.ToValidUTF8(raw, "\uFFFD")),
		Rationale:   rationale(a, params),
		ContextUsed: []string{"bridge tool " + a.Name},
	}
	if a.Risk != "" {
		req.RiskAssessment = proto.String(a.Risk)
	}
	// One call, one request: a client's retry is a new call. The key keeps
	// the client's own retries of a failed submission to one.
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	r.log.InfoContext(ctx, "governed tool: asking the Librarian", "tool", a.Name)
	out := r.gov.Governor.Ask(ctx, govern.Ask{Request: req, Key: "bridge/" + a.Name + "/" + hex.EncodeToString(b), MaxWait: a.ApprovalTimeout,
		Escalated: func(ctx context.Context, p govern.Pending) {
			r.log.InfoContext(ctx, "governed tool: escalated to a person", "tool", a.Name, "request_id", p.RequestID, "review_url", p.ReviewURL, "until", p.Deadline)
		}})
	if out.Allowed {
		r.log.InfoContext(ctx, "governed tool: approved", "tool", a.Name, "request_id", out.RequestID, "constraints", out.Constraints)
		return nil
	}
	r.log.WarnContext(ctx, "governed tool: not approved; the agent is not run", "tool", a.Name, "decision", out.Decision, "request_id", out.RequestID, "reason", out.Reason)
	return notApproved(a, out)
}

func notApproved(a *agentconfig.Agent, out govern.Outcome) error {
	msg := fmt.Sprintf("the Librarian's decision on %s is %s: %s", a.Name, out.Decision, out.Reason)
	if out.FailedClosed() {
		msg = fmt.Sprintf("the Librarian could not be asked about %s (%s), so the call is refused: %s", a.Name, out.Decision, out.Reason)
	}
	var details []string
	if out.RequestID != "" {
		details = append(details, "librarian request "+out.RequestID)
	}
	if out.ReviewURL != "" {
		details = append(details, "review: "+out.ReviewURL)
	}
	return &hybrid.Error{Kind: hybrid.KindNotApproved, ExitCode: -1, Message: msg, Details: strings.Join(details, "; ")}
}

// rationale is the caller's stated reason, a reason or rationale
// parameter, else what the call is.
func rationale(a *agentconfig.Agent, params map[string]any) string {
	for _, k := range []string{"reason", "rationale"} {
		if s, ok := params[k].(string); ok && strings.TrimSpace(s) != "" {
			return s
		}
	}
	return "An MCP client called the tool " + a.Name + " through the bridge."
}

// GovernanceMetrics are the governed tools' metrics (govern.Metrics).
type GovernanceMetrics struct {
	asked      metric.Int64Counter
	waited     metric.Float64Histogram
	failClosed metric.Int64Counter
}

// NewGovernanceMetrics makes the instruments from meter.
func NewGovernanceMetrics(meter metric.Meter) (*GovernanceMetrics, error) {
	m := &GovernanceMetrics{}
	var err error
	if m.asked, err = meter.Int64Counter(telemetry.MetricName("bridge", "approvals"),
		metric.WithDescription("Calls of governed tools asked of the Librarian, by outcome."), metric.WithUnit("{call}")); err != nil {
		return nil, err
	}
	if m.waited, err = meter.Float64Histogram(telemetry.MetricName("bridge", "approval_wait"),
		metric.WithDescription("Time calls of governed tools the Librarian escalated waited for a person, by outcome."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(1, 5, 15, 60, 300, 900, 3600, 4*3600, 24*3600)); err != nil {
		return nil, err
	}
	if m.failClosed, err = meter.Int64Counter(telemetry.MetricName("bridge", "approval_fail_closed"),
		metric.WithDescription("Calls of governed tools refused because the Librarian could not answer, by reason."), metric.WithUnit("{call}")); err != nil {
		return nil, err
	}
	return m, nil
}

// Asked counts an ask by outcome (govern's outcomes).
func (m *GovernanceMetrics) Asked(outcome string) {
	m.asked.Add(context.Background(), 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// Waited records a wait for a person.
func (m *GovernanceMetrics) Waited(d time.Duration, outcome string) {
	m.waited.Record(context.Background(), d.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}

// FailedClosed counts a refusal made because the Librarian could not
// answer.
func (m *GovernanceMetrics) FailedClosed(reason string) {
	m.failClosed.Add(context.Background(), 1, metric.WithAttributes(attribute.String("reason", reason)))
}
