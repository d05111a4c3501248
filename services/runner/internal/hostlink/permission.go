package hostlink

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/trace"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// pendingPermission is a permission request of the agent's waiting for the
// runner's answer.
type pendingPermission struct {
	req    *runnerv1.PermissionRequest
	answer chan *runnerv1.PermissionAnswer
}

// askRunner decides a permission request under the librarian policy: the
// runner asks the Librarian (it holds the token and hears the decisions),
// so agent-host sends it the request and waits for its answer, for as long
// as a person may take, until ctx ends (the turn cancelled, the agent
// gone). A runner that restarts meanwhile is sent the request again.
func (h *host) askRunner(ctx context.Context, p acp.PermissionRequest) acp.PermissionAnswer {
	req := &runnerv1.PermissionRequest{Params: p.Params, Workspace: h.s.Workspace, Traceparent: traceparent(h.spanOf(ctx)), Turn: h.agent.runningTurn()}
	pp := &pendingPermission{req: req, answer: make(chan *runnerv1.PermissionAnswer, 1)}
	h.mu.Lock()
	h.permSeq++
	req.Id = h.permSeq
	h.permissions[req.Id] = pp
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.permissions, req.Id)
		h.mu.Unlock()
	}()
	if err := h.buf.push(context.WithoutCancel(ctx), &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_PermissionRequest{PermissionRequest: req}}); err != nil {
		return acp.PermissionAnswer{Meta: map[string]any{"decision": "unavailable", "reason": "the runner could not be asked: " + err.Error()}}
	}
	select {
	case a := <-pp.answer:
		var meta map[string]any
		if json.Unmarshal(a.GetMeta(), &meta) != nil {
			meta = nil
		}
		return acp.PermissionAnswer{Allow: a.GetAllow(), Meta: meta}
	case <-ctx.Done():
		return acp.PermissionAnswer{Meta: map[string]any{"decision": "cancelled"}}
	}
}

// spanOf is ctx's span, else the turn's.
func (h *host) spanOf(ctx context.Context) trace.SpanContext {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc
	}
	a := h.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.turnSpan.IsValid() {
		return a.turnSpan
	}
	return a.rootSpan
}

// answered hands the runner's answer to the request it names, if it is
// this process's and still waiting.
func (h *host) answered(a *runnerv1.PermissionAnswer) {
	if a.GetHostId() != h.hostID {
		return
	}
	h.mu.Lock()
	pp := h.permissions[a.GetId()]
	h.mu.Unlock()
	if pp == nil {
		return
	}
	select {
	case pp.answer <- a:
	default:
	}
}

// resendPermissions sends a new link (a restarted runner, which did not
// see them, or saw them and died) every request still unanswered.
func (h *host) resendPermissions(ctx context.Context) {
	h.mu.Lock()
	reqs := make([]*runnerv1.PermissionRequest, 0, len(h.permissions))
	for _, pp := range h.permissions {
		reqs = append(reqs, pp.req)
	}
	h.mu.Unlock()
	for _, r := range reqs {
		_ = h.buf.push(context.WithoutCancel(ctx), &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_PermissionRequest{PermissionRequest: r}})
	}
}

// runningTurn is the durable number of the turn the agent runs, or 0.
func (a *agentRun) runningTurn() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	for n, t := range a.turns {
		if t.running && t.ended == nil {
			return n
		}
	}
	return 0
}
