package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// drive runs the protocol: the handshake, then the conversation. It returns
// an outcome and, for a failure, why.
func (ss *session) drive(ctx context.Context, client *acp.Client) (outcome, reason string) {
	o := ss.s.o
	hs, cancel := context.WithTimeout(ctx, o.ProtocolTimeout)
	defer cancel()
	fail := func(method string, err error) (string, string) {
		return client.HandshakeFailure(method, err, o.ProtocolTimeout)
	}
	if err := client.Initialize(hs); err != nil {
		return fail("initialize", err)
	}
	if method, err := client.Authenticate(hs); err != nil {
		return fail("authenticate", err)
	} else if method != "" {
		ss.log.Add(StreamRunner, "authenticated with the agent's auth method "+method)
	}
	sessionID := ss.launch.SessionID
	if sessionID != "" && client.Capabilities().LoadSession {
		if err := client.LoadSession(hs, ss.launch.Workspace, sessionID); err != nil {
			return fail("session/load", err)
		}
	} else if client.Dialect() != acp.DialectLegacy {
		var err error
		if sessionID, err = client.NewSession(hs, ss.launch.Workspace); err != nil {
			return fail("session/new", err)
		}
	}
	cancel()
	ss.mu.Lock()
	containerID := ss.proc.ID()
	ss.mu.Unlock()
	sessionUp := func(in *records.Instance) {
		in.Status, in.SessionID, in.Dialect, in.ContainerID = records.StatusRunning, sessionID, client.Dialect(), containerID
	}
	if sessionID != "" {
		defer ss.recordSession(ctx, sessionID)()
	}
	return ss.converse(ctx, client, sessionUp, client.Dialect() == acp.DialectLegacy)
}

// recordSession records the session on the task, for resuming later. It
// writes beside the first turn rather than before it, as the turn should
// not wait on the write; the func it returns waits for the write.
func (ss *session) recordSession(ctx context.Context, sessionID string) (wait func()) {
	taskWritten := make(chan struct{})
	go func() {
		defer close(taskWritten)
		if _, err := ss.s.o.Records.UpdateTask(ctx, ss.launch.TaskID, func(t *records.Task) {
			if t.Metadata == nil {
				t.Metadata = map[string]any{}
			}
			t.Metadata["session_id"] = sessionID
			// Kandev's name for it: a launch with env AUGGIE_SESSION_ID
			// set to it resumes the session.
			t.Metadata["auggie_session_id"] = sessionID
			t.Metadata["instance_id"] = ss.launch.ID
		}); err != nil {
			ss.s.log.WarnContext(ctx, "runner: recording the session on the task", "task_id", ss.launch.TaskID, "error", err)
		}
	}()
	return func() { <-taskWritten }
}

// converse runs the launch's pending turn (a legacy agent's run is always
// one), then further prompts until the agent goes idle for too long or
// goes away. sessionUp adds the session's fields to the first status
// write.
func (ss *session) converse(ctx context.Context, client conversation, sessionUp func(in *records.Instance), legacy bool) (outcome, reason string) {
	o := ss.s.o
	defer func() { ss.closeGateway(outcome, reason) }()
	launch := ss.launch
	pending := launch.PendingTurn() || legacy
	// Cancelled while its runner was gone.
	cancelledWhileGone := pending && launch.CancelTurn == launch.Turn && launch.Turn > 0
	if cancelledWhileGone {
		pending = false
	}
	// The session takes prompts before its status says so: a caller that
	// prompts as soon as it reads running (or stopped) must not be told
	// the agent is still starting.
	ss.mu.Lock()
	ss.client = client
	if pending {
		ss.turning = true
		ss.turns++
		ss.turnID = client.BeginTurn()
	}
	ss.mu.Unlock()
	ss.openGateway()
	if cancelledWhileGone {
		ss.setStatus(ctx, func(in *records.Instance) {
			sessionUp(in)
			in.Status, in.TurnDone, in.Prompt, in.CancelTurn = records.StatusStopped, in.Turn, "", 0
			if in.FinishedAt.IsZero() {
				in.FinishedAt = time.Now().UTC()
			}
		})
	} else if !pending {
		ss.setStatus(ctx, sessionUp)
	}
	o.Metrics.Launch("started")
	if pending {
		// The session's fields go in the turn's start write.
		if out, why := ss.turn(ctx, client, pendingPrompt{turn: launch.Turn, message: launch.Prompt}, sessionUp); out != "" {
			return out, why
		}
	}
	idle := time.NewTimer(o.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case p := <-ss.prompts:
			if out, why := ss.turn(ctx, client, p, nil); out != "" {
				return out, why
			}
			idle.Reset(o.IdleTimeout)
		case <-client.Done():
			return "", ""
		case <-idle.C:
			// Under the lock prompt() reserves a turn with, so that a
			// prompt is either taken here or refused there.
			ss.mu.Lock()
			if ss.turning {
				ss.mu.Unlock()
				idle.Reset(o.IdleTimeout)
				continue
			}
			ss.ending = true
			ss.mu.Unlock()
			ss.log.Add(StreamRunner, fmt.Sprintf("idle for %s; stopping the agent (a prompt resumes the session)", o.IdleTimeout))
			return "", ""
		}
	}
}

func protocolFailure(method string, err error, timeout time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("dead protocol: no answer to %s within %s", method, timeout)
	}
	return fmt.Sprintf("%s failed: %v", method, err)
}

// turn runs one prompt turn and records how it ended. A non-empty outcome
// ends the launch: the agent is gone. start, if not nil, is written beside
// the turn's start (the launch's first turn); a later prompt's start was
// written when it was accepted.
func (ss *session) turn(ctx context.Context, client conversation, p pendingPrompt, start func(in *records.Instance)) (outcome, reason string) {
	if start != nil {
		// The client waits on the agent's first update, not on this write:
		// the prompt goes out while it commits.
		ss.setStatusBeside(ctx, func(in *records.Instance) {
			start(in)
			in.Status, in.Progress, in.FinishedAt, in.Error = records.StatusRunning, 0, time.Time{}, ""
			if a := in.Approval; a != nil && a.Turn == p.turn {
				// The turn is taken up after a restart, its permission
				// request still waiting for a person (the agent asks
				// again, and the wait goes on).
				in.Status = records.StatusAwaitingApproval
			}
		})
	}
	var (
		t   acp.Turn
		err error
	)
	if p.parent.IsValid() {
		// A gateway client's message: the turn, its prompt to the agent
		// (params._meta.traceparent), its permission requests and its
		// status events are in the client's trace.
		var span trace.Span
		ctx, span = ss.s.tracer.Start(trace.ContextWithRemoteSpanContext(ctx, p.parent), "gateway message turn", trace.WithSpanKind(trace.SpanKindInternal))
		defer span.End()
	}
	turnCtx, endTurn := context.WithCancel(context.WithoutCancel(ctx))
	defer endTurn()
	ss.mu.Lock()
	ss.curTurn, ss.said, ss.saidBefore, ss.turnCtx = p.turn, "", "", turnCtx
	ss.mu.Unlock()
	stopWatch := ss.watchSilence(client)
	if d, ok := client.(durableTurns); ok {
		t, err = d.PromptTurn(ctx, int64(p.turn), p.message, ss.s.o.ProtocolTimeout)
	} else {
		t, err = client.Prompt(ctx, p.message, ss.s.o.ProtocolTimeout)
	}
	stopWatch()
	ss.mu.Lock()
	ss.turning = false
	ss.mu.Unlock()
	kind, why := ss.killedWhy()
	if kind.quiet() {
		// The turn stays pending: whoever runs the launch next runs it.
		return "stopping", why
	}
	status, errText := records.StatusCompleted, ""
	switch t.StopReason {
	case acp.StopEndTurn:
	case acp.StopCancelled:
		status = records.StatusStopped
	case acp.StopError:
		status, errText = records.StatusFailed, t.Message
		if errors.Is(err, context.DeadlineExceeded) {
			errText = protocolFailure("session/prompt", err, ss.s.o.ProtocolTimeout)
		}
	default:
		// max_tokens, max_turn_requests, refusal: the turn ended, short.
		errText = "stop reason: " + t.StopReason
	}
	switch kind {
	case stopCancel:
		status, errText = records.StatusStopped, why
	case stopFailure, stopDead:
		status, errText = records.StatusFailed, why
	}
	ss.setStatus(ctx, func(in *records.Instance) {
		in.Status, in.Error, in.FinishedAt, in.Approval = status, errText, time.Now().UTC(), nil
		if status == records.StatusCompleted {
			in.Progress = 100
		}
		if in.Turn == p.turn {
			in.Prompt = ""
		}
		in.TurnDone = max(in.TurnDone, p.turn)
		if in.CancelTurn <= p.turn {
			in.CancelTurn = 0
		}
	})
	ss.gatewayTurnEnded(p.turn, status, errText)
	if kind == stopDead {
		return "dead_protocol", errText
	}
	if err != nil && (errors.Is(err, acp.ErrAgentGone) || errors.Is(err, context.DeadlineExceeded)) {
		if errors.Is(err, context.DeadlineExceeded) {
			return "dead_protocol", errText
		}
		if status == records.StatusStopped {
			return "cancelled", errText
		}
		return "crashed", errText
	}
	return "", ""
}

// onUpdate records an update: a log line, progress, and an event. It runs on
// the client's read loop, in order.
func (ss *session) onUpdate(ctx context.Context, u acp.Update) {
	if u.Replay {
		// The session's history, which was published when it happened.
		ss.s.o.Metrics.Drop(acp.DropReplay)
		ss.s.log.DebugContext(ctx, "runner: a session/load replayed an update; not logged or published again", "instance_id", ss.launch.ID, "kind", u.Kind)
		return
	}
	ss.s.o.Metrics.Update(u.Kind)
	ss.noteSaid(u)
	text := u.Kind
	if u.ToolName != "" || u.ToolCallID != "" {
		text += " " + firstNonEmpty(u.ToolName, u.ToolCallID)
	}
	if u.ToolStatus != "" {
		text += " [" + u.ToolStatus + "]"
	}
	if u.Text != "" {
		text += ": " + u.Text
	}
	ss.log.Add(StreamACP, text)
	ss.gatewayUpdate(u)
	ss.stMu.Lock()
	progress := ss.in.Progress
	ss.stMu.Unlock()
	if u.Progress >= 0 && u.Progress != progress {
		ss.setStatus(ctx, func(in *records.Instance) { in.Progress = u.Progress })
	}
	payload := map[string]any{"instance_id": ss.launch.ID, "kind": u.Kind, "update": string(u.Raw)}
	if u.Text != "" {
		payload["text"] = u.Text
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// Notifications without a traceparent of their own belong to the
		// launch's trace.
		ctx = ss.traceCtx(ctx)
	}
	ss.s.events.Publish(ctx, EventSessionUpdate, ss.launch.TaskID, ss.launch.ID, payload)
}

// traceCtx is ctx with the launch's span context.
func (ss *session) traceCtx(ctx context.Context) context.Context {
	if ss.launchSpan.IsValid() {
		return trace.ContextWithSpanContext(ctx, ss.launchSpan)
	}
	return ctx
}

// heardFrom is a conversation that knows when its agent last wrote
// anything (the ACP client over a local agent's stdout).
type heardFrom interface {
	LastHeard() time.Time
}

// watchSilence watches a turn of client for a dead protocol: an agent that
// has sent nothing at all (no update, request or response, not even part
// of a line) for the silence limit of its type is killed, and the turn
// fails. An agent that thinks for long keeps the turn alive with updates
// (ACP agent_thought_chunk, a kandev progress update, a legacy heartbeat)
// or needs a longer silence_timeout; the type's timeout bounds the launch
// either way. The returned func stops the watch.
func (ss *session) watchSilence(client conversation) (stop func()) {
	h, ok := client.(heardFrom)
	limit := ss.silence
	if !ok || limit <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		since := time.Now()
		check := time.NewTimer(limit)
		defer check.Stop()
		for {
			select {
			case <-done:
				return
			case <-check.C:
			}
			last := h.LastHeard()
			if last.Before(since) {
				last = since
			}
			if ss.asking.Load() > 0 {
				// The agent waits on our answer to its permission
				// request (a person may take long): it is not silent.
				since, last = time.Now(), time.Now()
			}
			if quiet := time.Since(last); quiet < limit {
				check.Reset(limit - quiet)
				continue
			}
			ss.log.Add(StreamRunner, fmt.Sprintf("the agent has sent nothing for %s in the middle of a turn; killing it (dead protocol)", limit))
			ss.kill(stopDead, fmt.Sprintf("dead protocol: no message from the agent for %s mid-turn", limit))
			return
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}
