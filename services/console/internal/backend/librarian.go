package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// Librarian is the Librarian's governance API.
type Librarian struct{ *Client }

// Reviews lists the requests waiting for a reviewer (GET /reviews).
func (l Librarian) Reviews(ctx context.Context, token string) ([]*librarianv1.RequestStatus, error) {
	var out struct {
		Requests []json.RawMessage `json:"requests"`
	}
	if err := l.Do(ctx, token, "GET", "/reviews?status=escalated", nil, &out); err != nil {
		return nil, err
	}
	list := make([]*librarianv1.RequestStatus, 0, len(out.Requests))
	for _, raw := range out.Requests {
		var st librarianv1.RequestStatus
		if err := unmarshal.Unmarshal(raw, &st); err != nil {
			return nil, &Error{Service: "librarian", Kind: Unavailable, Status: 200, Message: "a review the console cannot read: " + err.Error(), Err: err}
		}
		list = append(list, &st)
	}
	return list, nil
}

// Decided lists the latest size decisions, the latest first (GET
// /reviews?status=decided).
func (l Librarian) Decided(ctx context.Context, token string, size int) ([]*librarianv1.DecidedRequest, error) {
	var out struct {
		Requests []json.RawMessage `json:"requests"`
	}
	if err := l.Do(ctx, token, "GET", fmt.Sprintf("/reviews?status=decided&page_size=%d", size), nil, &out); err != nil {
		return nil, err
	}
	list := make([]*librarianv1.DecidedRequest, 0, len(out.Requests))
	for _, raw := range out.Requests {
		var d librarianv1.DecidedRequest
		if err := unmarshal.Unmarshal(raw, &d); err != nil {
			return nil, &Error{Service: "librarian", Kind: Unavailable, Status: 200, Message: "a decision the console cannot read: " + err.Error(), Err: err}
		}
		list = append(list, &d)
	}
	return list, nil
}

// Decide approves or rejects an escalated request, returning its status
// and the trace id of the call.
func (l Librarian) Decide(ctx context.Context, token, requestID, decision, comment string) (*librarianv1.RequestStatus, string, error) {
	ctx, traceID := WithTrace(ctx)
	var st librarianv1.RequestStatus
	err := l.Do(ctx, token, "POST", "/reviews/"+url.PathEscape(requestID)+"/decision", map[string]string{"decision": decision, "comment": comment}, &st)
	return &st, traceID, err
}

// SearchGraph asks the knowledge graph for the nodes best matching query
// (POST /agent/context, as agentID).
func (l Librarian) SearchGraph(ctx context.Context, token, agentID, query string, limit int) ([]*librarianv1.NodeSummary, error) {
	var out librarianv1.ContextResponse
	err := l.Do(ctx, token, "POST", "/agent/context", map[string]any{"agent_id": agentID, "query": query, "limit": limit}, &out)
	return out.GetNodes(), err
}
