package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/events"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/pkg/auth"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// maxReviewList bounds GET /reviews.
const maxReviewList = 100

// Page sizes of GET /reviews?status=decided.
const (
	defaultDecidedPage = 50
	maxDecidedPage     = 100
)

func (h *Handler) listReviews(w http.ResponseWriter, r *http.Request) error {
	status := r.URL.Query().Get("status")
	if status == "" {
		status = "escalated"
	}
	if status == "decided" {
		return h.listDecided(w, r)
	}
	if status != "escalated" {
		return &apiError{Status: http.StatusBadRequest, Code: "unsupported_status", Field: "status", Message: "status is escalated (the requests waiting for a review) or decided (the decisions, latest first)"}
	}
	recs, err := h.Escalated(r.Context())
	if err != nil {
		return err
	}
	out := struct {
		Requests []jsonProto `json:"requests"`
	}{Requests: []jsonProto{}}
	for _, rec := range recs {
		out.Requests = append(out.Requests, jsonProto{statusOf(rec)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// decidedToken is the page token of GET /reviews?status=decided: where the
// listing got to.
type decidedToken struct {
	After string `json:"a"`
}

func (h *Handler) listDecided(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	size := defaultDecidedPage
	if v := q.Get("page_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDecidedPage {
			return &apiError{Status: http.StatusBadRequest, Code: "invalid_page_size", Field: "page_size", Message: fmt.Sprintf("page_size must be 1..%d", maxDecidedPage)}
		}
		size = n
	}
	var after string
	if v := q.Get("page_token"); v != "" {
		var tok decidedToken
		data, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || len(v) > 512 || json.Unmarshal(data, &tok) != nil || !requests.ValidDecidedPosition(tok.After) {
			return &apiError{Status: http.StatusBadRequest, Code: "invalid_page_token", Field: "page_token", Message: "page_token is not one this API gave; pass next_page_token unchanged"}
		}
		after = tok.After
	}
	page, err := h.o.Requests.ListDecided(r.Context(), size, after)
	if err != nil {
		return err
	}
	// DecidedRequests, with every member there, as marshal writes
	// messages: "requests" even when empty, next_page_token "" on the last
	// page.
	out := struct {
		Requests      []jsonProto `json:"requests"`
		NextPageToken string      `json:"next_page_token"`
	}{Requests: []jsonProto{}}
	for _, rec := range page.Records {
		out.Requests = append(out.Requests, jsonProto{decidedOf(rec)})
	}
	if page.Next != "" {
		data, _ := json.Marshal(decidedToken{After: page.Next})
		out.NextPageToken = base64.RawURLEncoding.EncodeToString(data)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// decidedOf is a decided request as GET /reviews?status=decided lists it.
func decidedOf(rec requests.Record) *librarianv1.DecidedRequest {
	d := &librarianv1.DecidedRequest{RequestId: rec.ID, AgentId: rec.AgentID, Decision: rec.State.Status(),
		DecidedAt: timestamppb.New(rec.DecidedAt), DecidedBy: "librarian", Request: statusOf(rec)}
	if rec.State == governance.Completed {
		d.Decision = governance.Approved.Status()
	}
	switch {
	case rec.Review != nil:
		d.DecidedBy, d.Reviewer, d.Comment = "reviewer", rec.Review.Reviewer, rec.Review.Comment
	case !rec.ReviewBy.IsZero():
		d.DecidedBy = "timeout"
	}
	return d
}

// jsonProto embeds a message in an encoding/json document with protojson.
type jsonProto struct{ m proto.Message }

func (j jsonProto) MarshalJSON() ([]byte, error) { return marshal.Marshal(j.m) }

// Decision is the body of POST /reviews/{request_id}/decision.
type Decision struct {
	Decision string `json:"decision"`
	Comment  string `json:"comment"`
}

const maxCommentBytes = 4 << 10

func (h *Handler) decideReview(w http.ResponseWriter, r *http.Request) error {
	var d Decision
	if err := jsonBody(r, maxCommentBytes*2+1024, &d); err != nil {
		return err
	}
	rec, err := h.Decide(r.Context(), principal(r.Context()), r.PathValue("request_id"), d)
	if err != nil {
		return err
	}
	writeProto(w, http.StatusOK, statusOf(rec))
	return nil
}

// Decide applies a reviewer's decision to an escalated request; the review
// page and the JSON API both come here.
func (h *Handler) Decide(ctx context.Context, reviewer access.Principal, id string, d Decision) (requests.Record, error) {
	if err := CheckRequestID(id); err != nil {
		return requests.Record{}, err
	}
	var to governance.State
	switch d.Decision {
	case "approve":
		to = governance.Approved
	case "reject":
		to = governance.Rejected
	default:
		return requests.Record{}, &apiError{Status: http.StatusBadRequest, Code: "unknown_decision", Field: "decision", Message: `decision must be "approve" or "reject"`}
	}
	d.Comment = strings.TrimSpace(d.Comment)
	if d.Comment == "" || len(d.Comment) > maxCommentBytes || !utf8.ValidString(d.Comment) {
		return requests.Record{}, &apiError{Status: http.StatusBadRequest, Code: "invalid_comment", Field: "comment", Message: fmt.Sprintf("a comment of 1 to %d bytes is required", maxCommentBytes)}
	}
	name := reviewer.Subject
	if name == "" {
		name = "developer"
	}
	expired := false
	h.settle(ctx, id)
	rec, err := h.o.Requests.Update(ctx, id, func(rec *requests.Record) error {
		expired = false // a retried update starts over
		if h.overdue(*rec) {
			expired = true
			return h.expire(ctx, rec)
		}
		if err := governance.Transition(rec.State, to); err != nil || rec.State != governance.Escalated {
			return &apiError{Status: http.StatusConflict, Code: "illegal_transition", Message: fmt.Sprintf("request %s is %s; only escalated requests are reviewed", rec.ID, rec.State.Status())}
		}
		rec.State = to
		rec.Review = &requests.Review{Reviewer: name, Decision: d.Decision, Comment: d.Comment, At: h.o.Now().UTC()}
		resp := rec.Response
		resp.Status = to.Status()
		resp.Feedback = fmt.Sprintf("%s by reviewer %s: %s", map[string]string{"approve": "Approved", "reject": "Rejected"}[d.Decision], name, d.Comment)
		if to == governance.Approved {
			if rec.Location != "" {
				resp.ApprovedLocation = proto.String(rec.Location)
			}
			if rec.Subject != "" {
				resp.AssignedId = proto.String(rec.Subject)
			}
		}
		return h.stage(ctx, rec, decisionEvent(to))
	})
	if errors.Is(err, requests.ErrNotFound) {
		return rec, &apiError{Status: http.StatusNotFound, Code: "request_not_found", Message: fmt.Sprintf("request %q does not exist", clip(id))}
	}
	if err != nil {
		return rec, err
	}
	h.publishStaged(ctx, rec)
	if expired {
		return rec, &apiError{Status: http.StatusConflict, Code: "escalation_expired",
			Message: fmt.Sprintf("request %s waited longer than timeouts.escalation (%s) for a review and was rejected", rec.ID, h.o.Policy.Protocol.Timeouts.Escalation)}
	}
	return rec, nil
}

// Request returns a stored request, for the review pages.
func (h *Handler) Request(ctx context.Context, id string) (requests.Record, error) {
	h.settle(ctx, id)
	rec, err := h.o.Requests.Get(ctx, id)
	if err != nil {
		return rec, err
	}
	return h.expireOverdue(ctx, rec)
}

// Escalated lists the requests waiting for a review, rejecting on the way
// those that waited past timeouts.escalation.
func (h *Handler) Escalated(ctx context.Context) ([]requests.Record, error) {
	recs, err := h.o.Requests.List(ctx, governance.Escalated, maxReviewList)
	if err != nil {
		return nil, err
	}
	waiting := recs[:0]
	for _, rec := range recs {
		if rec, err = h.expireOverdue(ctx, rec); err != nil {
			return nil, err
		}
		if rec.State == governance.Escalated {
			waiting = append(waiting, rec)
		}
	}
	return waiting, nil
}

// SweepEscalations rejects every escalated request past its deadline, as
// reading it would, so that the expiry and its event happen even for a
// request nobody reads: the local server runs it periodically, the Lambda
// when its EventBridge schedule invokes it. It returns how many requests it
// rejected.
func (h *Handler) SweepEscalations(ctx context.Context) (int, error) {
	expired, cursor := 0, ""
	for {
		recs, next, err := h.o.Requests.ListPage(ctx, governance.Escalated, maxReviewList, cursor)
		if err != nil {
			return expired, err
		}
		for _, rec := range recs {
			if !h.overdue(rec) {
				continue
			}
			now, err := h.expireOverdue(ctx, rec)
			if err != nil {
				return expired, err
			}
			if now.State == governance.Rejected {
				expired++
			}
		}
		if next == "" {
			return expired, nil
		}
		cursor = next
	}
}

// errSettled stops an expiry whose request was decided meanwhile.
var errSettled = errors.New("the request is no longer escalated")

// overdue reports whether rec waited for a human past its deadline.
func (h *Handler) overdue(rec requests.Record) bool {
	return rec.State == governance.Escalated && !rec.ReviewBy.IsZero() && !h.o.Now().Before(rec.ReviewBy)
}

// expireOverdue rejects rec if it is overdue (the Librarian protocol's
// timeouts.escalation: a human review may take that long) and returns the
// request as it is now. Lambdas have no background work, so expiry happens
// when a request is next read: its status, the review list or page, or a
// decision on it.
func (h *Handler) expireOverdue(ctx context.Context, rec requests.Record) (requests.Record, error) {
	if !h.overdue(rec) {
		return rec, nil
	}
	h.settle(ctx, rec.ID)
	next, err := h.o.Requests.Update(ctx, rec.ID, func(r *requests.Record) error {
		if !h.overdue(*r) {
			return errSettled
		}
		return h.expire(ctx, r)
	})
	if errors.Is(err, errSettled) {
		return next, nil
	}
	if err != nil {
		return rec, err
	}
	return h.publishStaged(ctx, next), nil
}

// expire rejects an escalated request no reviewer decided in time: an
// unreviewed change is not made (fail closed).
func (h *Handler) expire(ctx context.Context, rec *requests.Record) error {
	if err := governance.Transition(rec.State, governance.Rejected); err != nil {
		return err
	}
	limit := h.o.Policy.Protocol.Timeouts.Escalation
	rec.State = governance.Rejected
	resp := rec.Response
	resp.Status = governance.Rejected.Status()
	resp.Feedback = fmt.Sprintf("Rejected: no reviewer decided within timeouts.escalation (%s) of the escalation (%s).", limit, resp.GetEscalationReason())
	resp.Violations = append(resp.Violations, &librarianv1.ViolationDetail{Rule: "escalation_timeout", Severity: "error",
		Description: fmt.Sprintf("the escalation expired at %s without a human decision", rec.ReviewBy.Format(time.RFC3339))})
	resp.Suggestions = append(resp.Suggestions, "Resubmit the request if the change is still wanted, and ask a reviewer to decide it in time.")
	return h.stage(ctx, rec, events.Rejected)
}

// Authenticate checks a reviewer's token, for the review pages' sign-in.
func (h *Handler) Authenticate(r *http.Request, token string) (access.Principal, error) {
	if wait := h.o.Throttle.Refused(r.Context(), r.RemoteAddr); wait > 0 {
		return access.Principal{}, &apiError{Status: http.StatusTooManyRequests, Code: "too_many_wrong_tokens", Message: auth.ThrottledMessage,
			Headers: map[string]string{"Retry-After": auth.RetryAfter(wait)}}
	}
	if p, ok := h.o.Static.Verify(token); ok {
		return p, nil
	}
	p, err := h.o.Tokens.Verify(r.Context(), token)
	if errors.Is(err, access.ErrUnauthenticated) {
		h.o.Throttle.Fail(r.RemoteAddr)
	}
	return p, err
}

// RetryAfter is the Retry-After of an error Authenticate returned for a
// throttled address, or "".
func RetryAfter(err error) string {
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests {
		return ae.Headers["Retry-After"]
	}
	return ""
}
