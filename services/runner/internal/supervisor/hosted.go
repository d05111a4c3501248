package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// HostLinks reach agents run behind agent-host (the Kubernetes executor):
// agent-host speaks ACP to the agent where it runs and dials back to the
// runner, which converses with it over that link instead of over stdio.
type HostLinks interface {
	// Expect registers a launch whose agent-host will dial in; h takes
	// what it relays.
	Expect(instanceID string, launch int64, h HostHandlers) HostLink
	// Spec is agent-host's settings and token for a launch; sessionID is
	// a session to load, or empty; gw, when its AgentID is set, has
	// agent-host register the agent at the gateway.
	Spec(instanceID string, launch int64, typ agenttype.Type, sessionID string, gw GatewayAgent) executor.HostSpec
}

// HostHandlers take what a launch's agent-host relays. Updates and log
// lines reach OnUpdate and OnLog in order, once each. OnPermission, when
// not nil, decides the agent's permission requests (the librarian
// policy): their params as the agent sent them, its workspace in the pod,
// and the durable turn that asks. OnGatewayMessage and OnGatewayCancel,
// when not nil, take what reaches the agent at the gateway, where
// agent-host registered it.
type HostHandlers struct {
	OnUpdate         func(context.Context, acp.Update)
	OnLog            func(stream, text string)
	OnPermission     func(ctx context.Context, params json.RawMessage, workspace string, turn int) acp.PermissionAnswer
	OnGatewayMessage func(ctx context.Context, content string, accepted func(turn int)) error
	OnGatewayCancel  func(reason string)
}

// GatewayAgent is what agent-host registers at the gateway; none when
// AgentID is empty.
type GatewayAgent struct {
	AgentID, Name, AgentType string
	Capabilities             []string
}

// HostLink is one launch's link to its agent-host.
type HostLink interface {
	conversation
	// Ready waits for agent-host's handshake with the agent: the session's
	// id and the dialect spoken.
	Ready(ctx context.Context) (sessionID, dialect string, err error)
	// PromptTurn prompts as turn, the instance's durable turn number, so
	// that agent-host runs a turn once even when a restarted runner sends
	// it again.
	PromptTurn(ctx context.Context, turn int64, message string, acceptTimeout time.Duration) (acp.Turn, error)
	// Close ends the agent gracefully: agent-host closes its stdin.
	Close()
	// Detach lets go of the link and leaves the agent running, for the
	// runner that claims the launch next to adopt.
	Detach()
	// GatewayTurnEnded tells agent-host how a turn ended, as recorded,
	// for the gateway request whose turn it was.
	GatewayTurnEnded(turn int, end, errText string)
	// GatewayToolState tells agent-host the runner's own word on a tool
	// call of turn (a permission waiting for a person, then the
	// decision), for the gateway request whose turn it is.
	GatewayToolState(turn int, toolCallID string, state covenpb.ToolState, detail string)
}

// durableTurns is a conversation that takes the durable turn number.
type durableTurns interface {
	PromptTurn(ctx context.Context, turn int64, message string, acceptTimeout time.Duration) (acp.Turn, error)
}

// runHosted converses with a started agent behind agent-host, then ends
// the launch. A runner shutting down detaches rather than kills: the pod
// goes on working, and the runner that claims the launch next adopts it.
func (ss *session) runHosted(ctx context.Context, proc executor.Process, link HostLink) error {
	o := ss.s.o
	exitDone := make(chan struct{})
	var exitErr error
	go func() {
		exitErr = proc.Wait()
		close(exitDone)
	}()
	if phased, ok := proc.(executor.PhasedProcess); ok {
		go ss.logPhases(phased)
	}
	outcome, reason := ss.driveHosted(ctx, proc, link, exitDone)
	ss.mu.Lock()
	ss.ending = true
	ss.mu.Unlock()
	kind, why := ss.killedWhy()
	if kind == stopShutdown {
		link.Detach()
		return ss.end(ctx, proc, outcome, reason, nil, kind, why)
	}
	link.Close()
	select {
	case <-exitDone:
	case <-time.After(o.HostExitGrace):
		ss.kill(stopFailure, fmt.Sprintf("did not exit within %s of being told to end", o.HostExitGrace))
		<-exitDone
	}
	kind, why = ss.killedWhy()
	outcome, reason = podEnd(outcome, reason, exitErr, ss.timeout)
	return ss.end(ctx, proc, outcome, reason, exitErr, kind, why)
}

// podEnd adds what the end of the agent's pod says to what its link saw:
// the link sees the agent go, the pod says why (a Job past its deadline, a
// container's exit code and reason).
func podEnd(outcome, reason string, exitErr error, timeout time.Duration) (string, string) {
	switch {
	case exitErr == nil || outcome == "cancelled" || errors.Is(exitErr, executor.ErrJobDeleted):
		// A Job deleted is the runner's own kill, whose reason is set.
		return outcome, reason
	case errors.Is(exitErr, executor.ErrDeadlineExceeded):
		return "killed", fmt.Sprintf("deadline exceeded: the agent's Job ran past its timeout of %s", timeout)
	case reason == "":
		// end says "exited" with exitErr.
		return outcome, reason
	}
	return outcome, fmt.Sprintf("%s; %v", reason, exitErr)
}

// logPhases notes in the instance's log where its pod is: waiting to be
// scheduled, pulling images, running.
func (ss *session) logPhases(p executor.PhasedProcess) {
	for ph := range p.PhaseChanges() {
		if ph != executor.PhaseFinished {
			ss.log.Add(StreamRunner, fmt.Sprintf("pod %s: %s", p.ID(), ph))
		}
	}
}

// driveHosted waits for agent-host's handshake, then converses.
func (ss *session) driveHosted(ctx context.Context, proc executor.Process, link HostLink, exitDone <-chan struct{}) (outcome, reason string) {
	o := ss.s.o
	readyCtx, cancel := context.WithTimeout(ctx, o.HostStartTimeout)
	defer cancel()
	go func() {
		select {
		case <-exitDone:
			cancel()
		case <-readyCtx.Done():
		}
	}()
	sessionID, dialect, err := link.Ready(readyCtx)
	if err != nil {
		select {
		case <-exitDone:
			// The pod ended before agent-host was up (an image that cannot
			// be pulled, a crash): end says why.
			return "", ""
		default:
		}
		if kind, _ := ss.killedWhy(); kind != stopNone {
			return "", ""
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return "start_failed", fmt.Sprintf("agent-host did not report the agent's session within %s (CONCLAVE_RUNNER_HOST_START_TIMEOUT)", o.HostStartTimeout)
		}
		return "dead_protocol", fmt.Sprintf("agent-host: %v", err)
	}
	containerID := proc.ID()
	sessionUp := func(in *records.Instance) {
		in.Status, in.SessionID, in.Dialect, in.ContainerID = records.StatusRunning, sessionID, dialect, containerID
	}
	if sessionID != "" {
		defer ss.recordSession(ctx, sessionID)()
	}
	return ss.converse(ctx, link, sessionUp, dialect == acp.DialectLegacy)
}
