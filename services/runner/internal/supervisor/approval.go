package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	sdk "github.com/coder/acp-go-sdk"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/govern"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/approval"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// Governor asks the Librarian and waits for a person's decision on what it
// escalates (pkg/govern).
type Governor interface {
	Ask(ctx context.Context, a govern.Ask) govern.Outcome
}

// EventPermissionDecided announces how an agent's permission request under
// the librarian policy was decided, on task:{task_id}.
const EventPermissionDecided = "runner.permission.decided"

// maxSaid bounds what the session keeps of what its agent said since its
// last tool call: the stated reason of its next permission request.
const maxSaid = 4 << 10

// noteSaid keeps what the agent says in its turn, for the rationale of its
// next permission request: the text since its last tool call.
func (ss *session) noteSaid(u acp.Update) {
	switch u.Kind {
	case acp.KindContent:
		ss.mu.Lock()
		ss.said += u.Text
		if len(ss.said) > 2*maxSaid {
			ss.said = ss.said[len(ss.said)-maxSaid:]
		}
		ss.mu.Unlock()
	case acp.KindToolCall:
		ss.mu.Lock()
		if ss.said != "" {
			ss.saidBefore, ss.said = ss.said, ""
		}
		ss.mu.Unlock()
	}
}

// governor is the type's Govern for the ACP client: nil for a type that
// is not under the librarian policy. workspace is the workspace as the
// agent sees it, local the same on this host ("" when the runner does not
// see its files).
func (ss *session) governor(typ agenttype.Type, workspace, local string) func(context.Context, acp.PermissionRequest) acp.PermissionAnswer {
	if typ.Permission != agenttype.PermissionLibrarian {
		return nil
	}
	return func(ctx context.Context, p acp.PermissionRequest) acp.PermissionAnswer {
		return ss.askLibrarian(ctx, typ, workspace, local, 0, p)
	}
}

// hostedGovernor decides, for a type under the librarian policy, the
// permission requests agent-host relays from an agent in a pod (nil for
// other types): workspace is the agent's workspace in its pod; the runner
// sees the same files only when the workspace is a claim it mounts too.
// The wait ends with the turn.
func (ss *session) hostedGovernor(typ agenttype.Type) func(context.Context, json.RawMessage, string, int) acp.PermissionAnswer {
	if typ.Permission != agenttype.PermissionLibrarian {
		return nil
	}
	return func(ctx context.Context, params json.RawMessage, workspace string, turn int) acp.PermissionAnswer {
		var p sdk.RequestPermissionRequest
		if err := json.Unmarshal(params, &p); err != nil {
			return acp.PermissionAnswer{Meta: map[string]any{"decision": "unavailable", "reason": "the permission request is not ACP's: " + err.Error()}}
		}
		local := ""
		if fi, err := os.Stat(ss.launch.Workspace); err == nil && fi.IsDir() {
			local = ss.launch.Workspace
		}
		ss.mu.Lock()
		turnCtx := ss.turnCtx
		ss.mu.Unlock()
		if turnCtx != nil {
			var stop context.CancelFunc
			ctx, stop = context.WithCancel(ctx)
			defer stop()
			defer context.AfterFunc(turnCtx, stop)()
		}
		return ss.askLibrarian(ctx, typ, workspace, local, turn, acp.PermissionRequest{Params: params, ToolCall: p.ToolCall, Options: p.Options})
	}
}

// askLibrarian decides an agent's permission request by the Librarian:
// an APPROVAL request; if it is escalated, the instance is
// awaiting_approval (with the review's URL) until a person decides or the
// wait times out. Every refusal, and why, is in the log and on the task's
// topic. It fails closed.
//
// turn is the durable turn that asks, when the caller knows it (agent-host
// says; a request it sends a restarted runner may come before that runner
// has begun the turn); 0 is the turn in progress here.
func (ss *session) askLibrarian(ctx context.Context, typ agenttype.Type, workspace, local string, turn int, p acp.PermissionRequest) acp.PermissionAnswer {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = ss.traceCtx(ctx)
	}
	ss.asking.Add(1)
	defer ss.asking.Add(-1)
	ss.mu.Lock()
	said := ss.said
	if turn == 0 {
		turn = ss.curTurn
	}
	if said == "" {
		// The agent announced the tool call before it asked: what it
		// said before that is its reason.
		said = ss.saidBefore
	}
	ss.mu.Unlock()
	req, key := approval.Request(approval.Input{AgentType: typ.ID, InstanceID: ss.launch.ID, TaskID: ss.launch.TaskID, Turn: turn,
		Workspace: workspace, Local: local, ToolCall: p.ToolCall, Said: said})
	title := toolTitle(p)
	ss.log.Add(StreamRunner, fmt.Sprintf("permission requested: %s (%s %s); asking the Librarian", title, req.Action, req.TargetType))
	g := ss.s.o.Governor
	if g == nil {
		out := govern.Outcome{Decision: govern.Unavailable, Reason: "no Librarian is configured for this runner (CONCLAVE_RUNNER_LIBRARIAN_URL)"}
		return ss.answer(ctx, p, out)
	}
	// A wait taken up again (this runner restarted mid-wait, and the agent
	// asked again) keeps the deadline it had.
	var deadline time.Time
	ss.stMu.Lock()
	if a := ss.in.Approval; a != nil && a.Key == key {
		deadline = a.Deadline
	}
	ss.stMu.Unlock()
	out := g.Ask(ctx, govern.Ask{Request: req, Key: key, MaxWait: typ.ApprovalTimeout, Deadline: deadline,
		Escalated: func(ctx context.Context, pending govern.Pending) {
			ss.log.Add(StreamRunner, fmt.Sprintf("permission for %s escalated to a person (%s); waiting until %s; review: %s",
				title, firstNonEmpty(pending.Reason, "no reason given"), pending.Deadline.UTC().Format(time.RFC3339), pending.ReviewURL))
			ss.setStatus(ctx, func(in *records.Instance) {
				if in.Terminal() {
					return
				}
				in.Status = records.StatusAwaitingApproval
				in.Approval = &records.Approval{RequestID: pending.RequestID, ReviewURL: pending.ReviewURL, Key: key, Turn: turn,
					ToolCallID: string(p.ToolCall.ToolCallId), Title: title, Since: time.Now().UTC(), Deadline: pending.Deadline.UTC()}
			})
			// A gateway client sees the tool wait for a person, and where
			// that is decided; not the review's URL, which is the
			// reviewers'.
			ss.gatewayToolState(turn, string(p.ToolCall.ToolCallId), covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL,
				fmt.Sprintf("waiting for a person to decide this permission request in the Librarian's review (its review page or the console), until %s",
					pending.Deadline.UTC().Format(time.RFC3339)))
		}})
	if kind, _ := ss.killedWhy(); kind.quiet() {
		// The runner is stopping (or the launch moved on): the wait is
		// taken up by whoever runs the launch next; nothing is recorded.
		ss.log.Add(StreamRunner, fmt.Sprintf("permission for %s: the wait ends here, the launch will go on elsewhere", toolTitle(p)))
		return acp.PermissionAnswer{Meta: map[string]any{"decision": out.Decision}}
	}
	if out.Escalated {
		// The person's wait is over: the tool goes on, or does not.
		state := covenpb.ToolState_TOOL_STATE_DENIED
		switch {
		case out.Allowed:
			state = covenpb.ToolState_TOOL_STATE_RUNNING
		case out.Decision == govern.Timeout:
			state = covenpb.ToolState_TOOL_STATE_TIMEOUT
		case out.Decision == govern.Cancelled:
			state = covenpb.ToolState_TOOL_STATE_CANCELLED
		}
		ss.gatewayToolState(turn, string(p.ToolCall.ToolCallId), state, "permission "+out.Decision)
	}
	// The wait is over, however it ended (an answer replayed after a
	// restart ends one recorded by the runner before).
	ss.setStatus(context.WithoutCancel(ctx), func(in *records.Instance) {
		if in.Approval == nil || in.Approval.Key != key {
			return
		}
		if in.Status == records.StatusAwaitingApproval {
			in.Status = records.StatusRunning
		}
		in.Approval = nil
	})
	return ss.answer(ctx, p, out)
}

// answer logs and announces how a permission request was decided, and
// turns the outcome into the ACP client's answer.
func (ss *session) answer(ctx context.Context, p acp.PermissionRequest, out govern.Outcome) acp.PermissionAnswer {
	title := toolTitle(p)
	line := fmt.Sprintf("permission for %s: %s", title, out.Decision)
	if out.Escalated && out.Via != "" {
		line += fmt.Sprintf(" (after %s waiting for a person; the decision came by %s)", out.Waited.Round(time.Millisecond), map[string]string{"bus": "the bus", "status": "a status read"}[out.Via])
	}
	switch {
	case out.Allowed && len(out.Constraints) > 0:
		line += "; constraints: " + strings.Join(out.Constraints, "; ")
	case out.Allowed:
	case out.FailedClosed():
		line += " (failing closed: refused): " + out.Reason
	default:
		line += ": refused: " + out.Reason
	}
	if out.RequestID != "" {
		line += " [librarian request " + out.RequestID + "]"
	}
	ss.log.Add(StreamRunner, line)
	meta := map[string]any{"decision": out.Decision, "allowed": out.Allowed}
	if out.RequestID != "" {
		meta["request_id"] = out.RequestID
	}
	if out.ReviewURL != "" {
		meta["review_url"] = out.ReviewURL
	}
	if out.Reason != "" {
		meta["reason"] = out.Reason
	}
	if len(out.Constraints) > 0 {
		cs := make([]any, len(out.Constraints))
		for i, c := range out.Constraints {
			cs[i] = c
		}
		meta["constraints"] = cs
	}
	payload := map[string]any{"instance_id": ss.launch.ID, "tool_call_id": string(p.ToolCall.ToolCallId), "title": title,
		"escalated": out.Escalated, "failed_closed": out.FailedClosed()}
	for k, v := range meta {
		payload[k] = v
	}
	if out.Escalated {
		payload["waited_seconds"] = out.Waited.Seconds()
	}
	ss.s.events.Publish(ctx, EventPermissionDecided, ss.launch.TaskID, ss.launch.ID, payload)
	return acp.PermissionAnswer{Allow: out.Allowed, Meta: meta}
}

func toolTitle(p acp.PermissionRequest) string {
	title := string(p.ToolCall.ToolCallId)
	if p.ToolCall.Title != nil && *p.ToolCall.Title != "" {
		title = *p.ToolCall.Title
	}
	return fmt.Sprintf("%q", strings.Join(strings.Fields(title), " "))
}
