package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
)

// maxReviewList bounds GET /reviews.
const maxReviewList = 100

func (h *Handler) listReviews(w http.ResponseWriter, r *http.Request) error {
	status := r.URL.Query().Get("status")
	if status == "" {
		status = "escalated"
	}
	if status != "escalated" {
		return &apiError{Status: http.StatusBadRequest, Code: "unsupported_status", Field: "status", Message: "only status=escalated requests wait for a review"}
	}
	recs, err := h.o.Requests.List(r.Context(), governance.Escalated, maxReviewList)
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
	rec, err := h.o.Requests.Update(ctx, id, func(rec *requests.Record) error {
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
	h.flush(ctx, rec.ID)
	return rec, nil
}

// Request returns a stored request, for the review pages.
func (h *Handler) Request(ctx context.Context, id string) (requests.Record, error) {
	return h.o.Requests.Get(ctx, id)
}

// Escalated lists the requests waiting for a review.
func (h *Handler) Escalated(ctx context.Context) ([]requests.Record, error) {
	return h.o.Requests.List(ctx, governance.Escalated, maxReviewList)
}

// Authenticate checks a reviewer's token, for the review pages' sign-in.
func (h *Handler) Authenticate(r *http.Request, token string) (access.Principal, error) {
	if p, ok := h.o.Static.Verify(token); ok {
		return p, nil
	}
	return h.o.Tokens.Verify(r.Context(), token)
}
