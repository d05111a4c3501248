package govern

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// Outcomes of an Ask: the Librarian's decisions, and the refusals made
// without one.
const (
	Approved            = "approved"
	Rejected            = "rejected"
	ClarificationNeeded = "clarification_needed"
	// Timeout: escalated, and no person decided in time.
	Timeout = "timeout"
	// Unavailable: the Librarian could not be asked, or failed (fail
	// closed).
	Unavailable = "unavailable"
	// Refused: the Librarian refused to take the request (a 4xx: an agent
	// missing from its registry, a token it does not know), so nothing was
	// decided (fail closed).
	Refused = "refused"
	// Cancelled: the asker gave up (the agent's turn was cancelled).
	Cancelled = "cancelled"
)

// Metrics is told of each ask's outcome, of each wait for a person, and
// of each fail-closed denial.
type Metrics interface {
	Asked(outcome string)
	Waited(d time.Duration, outcome string)
	FailedClosed(reason string)
}

type noMetrics struct{}

func (noMetrics) Asked(string)                 {}
func (noMetrics) Waited(time.Duration, string) {}
func (noMetrics) FailedClosed(string)          {}

// Governor asks the Librarian and waits for a person's decision on what
// it escalates.
type Governor struct {
	client  *Client
	watcher *Watcher
	metrics Metrics
	tracer  trace.Tracer
	log     *slog.Logger
	// DefaultWait bounds a wait for a person when neither the ask nor the
	// Librarian's answer says how long (the Librarian protocol's 24 hours).
	DefaultWait time.Duration
}

// NewGovernor asks through client and hears decisions through watcher
// (nil: escalations are refused at once, as nothing would hear their
// decision). metrics and tp may be nil.
func NewGovernor(client *Client, watcher *Watcher, metrics Metrics, tp trace.TracerProvider, logger *slog.Logger) *Governor {
	if metrics == nil {
		metrics = noMetrics{}
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Governor{client: client, watcher: watcher, metrics: metrics, tracer: tp.Tracer("conclave-govern"), log: logger, DefaultWait: 24 * time.Hour}
}

// Ask is one request for the Librarian's approval.
type Ask struct {
	Request *librarianv1.AgentRequest
	// Key is the idempotency key: the same key is the same Librarian
	// request, however often it is sent.
	Key string
	// MaxWait, when above zero, bounds the wait for a person below the
	// Librarian's own escalation timeout (the runner's approval_timeout).
	MaxWait time.Duration
	// Deadline, when set, is the end of a wait begun before (by a runner
	// that restarted); it is kept rather than computed again.
	Deadline time.Time
	// Escalated, when set, is called once the request waits for a person,
	// before the wait begins.
	Escalated func(ctx context.Context, p Pending)
}

// Pending is an escalated request waiting for a person.
type Pending struct {
	RequestID string
	ReviewURL string
	Reason    string
	Deadline  time.Time
}

// Outcome is how an ask ended.
type Outcome struct {
	// Allowed is true only for an approval.
	Allowed bool
	// Decision is one of the outcomes above.
	Decision  string
	RequestID string
	ReviewURL string
	// Reason says why, for a refusal: the Librarian's feedback and
	// violations, or what failed.
	Reason      string
	Constraints []string
	// Escalated: a person was asked; Waited is how long the wait took.
	Escalated bool
	Waited    time.Duration
	// Via says how an escalated request's decision came: "bus" (its event)
	// or "status" (read once: on a reconnection, a restart, or at the
	// deadline).
	Via string
}

// FailedClosed reports whether the outcome is a refusal made because the
// Librarian could not answer, rather than its decision.
func (o Outcome) FailedClosed() bool { return o.Decision == Unavailable || o.Decision == Refused }

// Ask submits a.Request and, if the Librarian escalates it, waits for a
// person's decision, which arrives on the bus, until the deadline: the
// Librarian's escalation timeout or a.MaxWait, whichever comes first. At
// the deadline it reads the request's status once (the Librarian then
// applies its own timeout, with its reason) and refuses what is still
// undecided. Anything that goes wrong refuses: it never allows a request
// because it could not ask.
func (g *Governor) Ask(ctx context.Context, a Ask) Outcome {
	ctx, span := g.tracer.Start(ctx, "librarian approval", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("conclave.librarian.agent_id", a.Request.GetAgentId()),
			attribute.String("conclave.librarian.action", a.Request.GetAction()),
			attribute.String("conclave.librarian.target_type", a.Request.GetTargetType())))
	defer span.End()
	out := g.ask(ctx, a, span)
	span.SetAttributes(attribute.String("conclave.librarian.request_id", out.RequestID),
		attribute.String("conclave.librarian.decision", out.Decision), attribute.Bool("conclave.librarian.escalated", out.Escalated))
	if !out.Allowed {
		span.SetStatus(codes.Error, out.Decision+": "+out.Reason)
	}
	g.metrics.Asked(out.Decision)
	if out.FailedClosed() {
		g.metrics.FailedClosed(out.Decision)
	}
	if out.Escalated {
		g.metrics.Waited(out.Waited, out.Decision)
	}
	return out
}

func (g *Governor) ask(ctx context.Context, a Ask, span trace.Span) (out Outcome) {
	resp, err := g.client.Submit(ctx, a.Request, a.Key)
	if err != nil {
		return g.failed(ctx, err, "submitting the request")
	}
	out = Outcome{RequestID: resp.GetRequestId(), ReviewURL: resp.GetHumanReviewUrl()}
	if resp.GetStatus() != "escalated" {
		return decide(out, resp.GetStatus(), resp)
	}
	out.Escalated = true
	if g.watcher == nil {
		out.Decision, out.Reason = Unavailable, "escalated for review, but no bus is configured to hear the decision"
		return out
	}
	deadline := a.Deadline
	if deadline.IsZero() {
		deadline = g.deadline(a, resp)
	}
	started := time.Now()
	defer func() { out.Waited = time.Since(started) }()
	agent := a.Request.GetAgentId()
	watch := g.watcher.Watch(out.RequestID, agent)
	defer watch.Stop()
	span.AddEvent("escalated", trace.WithAttributes(attribute.String("conclave.librarian.review_url", out.ReviewURL),
		attribute.String("conclave.librarian.deadline", deadline.UTC().Format(time.RFC3339))))
	if a.Escalated != nil {
		a.Escalated(ctx, Pending{RequestID: out.RequestID, ReviewURL: out.ReviewURL, Reason: resp.GetEscalationReason(), Deadline: deadline})
	}
	if !a.Deadline.IsZero() {
		// A wait taken up again: the decision may have come while no one
		// listened.
		go g.watcher.Check(context.WithoutCancel(ctx), out.RequestID, agent)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case d := <-watch.C:
		g.traceDecision(ctx, d)
		out.Via = d.Via
		return decide(out, d.Status, d.Response)
	case <-ctx.Done():
		out.Decision, out.Reason = Cancelled, "the wait for a decision was given up: "+context.Cause(ctx).Error()
		return out
	case <-timer.C:
	}
	// The deadline: one last read, which makes the Librarian apply its
	// own escalation timeout if it is due.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	g.watcher.Check(cctx, out.RequestID, agent)
	cancel()
	select {
	case d := <-watch.C:
		g.traceDecision(ctx, d)
		out.Via = d.Via
		return decide(out, d.Status, d.Response)
	default:
	}
	out.Decision = Timeout
	out.Reason = fmt.Sprintf("no one decided within the time allowed (until %s)", deadline.UTC().Format(time.RFC3339))
	return out
}

// deadline is when a wait for a person on resp ends: the Librarian's
// estimate (whole minutes, rounded down, so a minute more) or the default,
// cut to a.MaxWait, counted from the escalation.
func (g *Governor) deadline(a Ask, resp *librarianv1.LibrarianResponse) time.Time {
	wait := g.DefaultWait
	if resp.EstimatedReviewTime != nil {
		wait = time.Duration(resp.GetEstimatedReviewTime()+1) * time.Minute
	}
	if a.MaxWait > 0 && a.MaxWait < wait {
		wait = a.MaxWait
	}
	from := time.Now()
	if ts := resp.GetTimestamp(); ts != nil && ts.AsTime().Before(from) {
		// A replayed submission: the escalation began then.
		from = ts.AsTime()
	}
	return from.Add(wait)
}

// traceDecision marks the decision's arrival: a span in the ask's trace,
// linked to the event that brought it.
func (g *Governor) traceDecision(ctx context.Context, d Decision) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		attribute.String("conclave.librarian.request_id", d.RequestID), attribute.String("conclave.librarian.decision", d.Status),
		attribute.String("conclave.librarian.via", d.Via))}
	if d.Event.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: d.Event}))
	}
	_, span := g.tracer.Start(ctx, "librarian decision", opts...)
	span.End()
}

// decide turns the Librarian's status into an outcome.
func decide(out Outcome, status string, resp *librarianv1.LibrarianResponse) Outcome {
	switch status {
	case "approved", "completed":
		out.Allowed, out.Decision = true, Approved
		out.Constraints = resp.GetConstraints()
		out.Reason = resp.GetFeedback()
	case "rejected", "clarification_needed":
		out.Decision, out.Reason = status, reasonOf(resp)
	default:
		out.Decision, out.Reason = Unavailable, fmt.Sprintf("the Librarian answered with status %q", status)
	}
	return out
}

// reasonOf is a refusal's feedback with its violations.
func reasonOf(resp *librarianv1.LibrarianResponse) string {
	parts := []string{strings.TrimSpace(resp.GetFeedback())}
	for _, v := range resp.GetViolations() {
		parts = append(parts, fmt.Sprintf("%s: %s", v.GetRule(), v.GetDescription()))
	}
	var keep []string
	for _, p := range parts {
		if p != "" {
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		return "no reason given"
	}
	return clip(strings.Join(keep, "; "), 2000)
}

// failed is the fail-closed outcome of a call that went wrong.
func (g *Governor) failed(ctx context.Context, err error, doing string) Outcome {
	out := Outcome{Decision: Unavailable}
	var refused *Error
	switch {
	case errors.As(err, &refused):
		out.Decision = Refused
	case ctx.Err() != nil:
		out.Decision = Cancelled
	}
	out.Reason = fmt.Sprintf("%s: %v", doing, err)
	if out.Decision != Cancelled {
		g.log.WarnContext(ctx, "govern: failing closed: the request is refused", "reason", out.Reason)
	}
	return out
}
