package hostlink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// maxRememberedTurns bounds the ended turns agent-host keeps, to answer a
// prompt re-sent for one of them.
const maxRememberedTurns = 256

// orphanGrace is how long the agent's stdout and stderr are read after it
// exits: a descendant that escaped its group and holds them cannot keep
// agent-host up.
const orphanGrace = 2 * time.Second

// agentRun is the agent process and its turns.
type agentRun struct {
	h *host

	mu sync.Mutex
	// pid is the agent's process (and group) id, once started; exited is
	// set once it has been waited for.
	pid    int
	exited bool
	client *acp.Client
	// closed: the runner asked for the agent's end (Close).
	closed bool
	// why is the reason the agent was ended by agent-host, if it was;
	// refused: it was ended because the runner refused the link or gave
	// no sign of life past the give-up time.
	why     string
	refused bool
	// halted: the link is refused; an agent not yet started is killed as
	// soon as it is.
	halted bool
	// queue holds prompts not yet begun, in order; turns every turn known
	// (queued, running or ended), by number; order the ended ones, oldest
	// first.
	queue   []*hostTurn
	turns   map[int64]*hostTurn
	order   []int64
	kick    chan struct{}
	closeCh chan struct{}
	// turnSpan is the span of the turn running, for updates that carry no
	// trace context of their own.
	turnSpan trace.SpanContext
	rootSpan trace.SpanContext
	// curTurn is the durable number of the turn running, 0 between turns:
	// its updates go to the gateway request whose turn it is.
	curTurn int64
	// ready is the session as reported, once up.
	ready *runnerv1.Ready
}

// resendReady reports the session again, to a new link (a restarted
// runner) that did not see it.
func (a *agentRun) resendReady(ctx context.Context) {
	a.mu.Lock()
	r := a.ready
	a.mu.Unlock()
	if r != nil {
		_ = a.h.buf.push(context.WithoutCancel(ctx), &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_Ready{Ready: r}})
	}
}

type hostTurn struct {
	p         *runnerv1.Prompt
	cancelled bool
	reason    string
	running   bool
	clientID  uint64
	ended     *runnerv1.TurnEnded
}

func newAgentRun(h *host) *agentRun {
	return &agentRun{h: h, turns: map[int64]*hostTurn{}, kick: make(chan struct{}, 1), closeCh: make(chan struct{})}
}

func (a *agentRun) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// prompt queues a turn, unless it is known: a turn that ended has its
// TurnEnded sent again (the runner that asked may not have taken it), one
// queued or running is left alone.
func (a *agentRun) prompt(ctx context.Context, p *runnerv1.Prompt) {
	a.mu.Lock()
	t, known := a.turns[p.GetTurn()]
	if !known {
		t = &hostTurn{p: p}
		a.turns[p.GetTurn()] = t
		a.queue = append(a.queue, t)
		a.mu.Unlock()
		a.wake()
		return
	}
	ended := t.ended
	a.mu.Unlock()
	if ended != nil {
		again := &runnerv1.TurnEnded{Turn: ended.GetTurn(), StopReason: ended.GetStopReason(), Message: ended.GetMessage(), Failure: ended.GetFailure()}
		// Not on the link's receiving goroutine, which a full buffer would
		// block, and with it the acks that empty the buffer.
		go func() {
			_ = a.h.buf.push(context.WithoutCancel(ctx), &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_TurnEnded{TurnEnded: again}})
		}()
	}
}

// cancel ends a queued turn without sending it, or asks the agent to end
// the running one.
func (a *agentRun) cancel(ctx context.Context, c *runnerv1.Cancel) {
	a.mu.Lock()
	t := a.turns[c.GetTurn()]
	switch {
	case t == nil || t.ended != nil:
		a.mu.Unlock()
		return
	case !t.running:
		t.cancelled, t.reason = true, c.GetReason()
		a.mu.Unlock()
		a.wake()
		return
	}
	client, id := a.client, t.clientID
	a.mu.Unlock()
	go func() {
		a.h.note(context.WithoutCancel(ctx), "cancel requested for turn %d: %s", c.GetTurn(), c.GetReason())
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.h.s.KillGrace)
		defer cancel()
		if err := client.CancelTurn(cctx, c.GetReason(), id); err != nil && cctx.Err() == nil {
			a.h.note(ctx, "the agent could not be told to cancel: %v", err)
		}
	}()
}

// close ends the agent gracefully: its stdin is closed.
func (a *agentRun) close(ctx context.Context) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	client := a.client
	close(a.closeCh)
	a.mu.Unlock()
	if client != nil {
		_ = client.Close()
	}
	go a.h.note(context.WithoutCancel(ctx), "closed the agent's stdin, as the runner asked")
}

func (a *agentRun) endedByRefusal() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}

// killGroup kills the agent's process group, if it was started.
func (a *agentRun) killGroup() { a.signalGroup(syscall.SIGKILL) }

func (a *agentRun) signalGroup(sig syscall.Signal) {
	a.mu.Lock()
	pid, exited := a.pid, a.exited
	a.mu.Unlock()
	if pid > 0 && !exited {
		_ = syscall.Kill(-pid, sig)
	}
}

// runAgent starts the agent and relays until it exits, then pushes its
// Exited and returns agent-host's exit code.
func (h *host) runAgent(ctx context.Context) (int, error) {
	a := h.agent
	exit := func(code int, signal, reason string) {
		_ = h.buf.push(context.WithoutCancel(ctx), &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_Exited{Exited: &runnerv1.Exited{ExitCode: int32(code), Signal: signal, Reason: reason}}})
	}
	a.mu.Lock()
	closed := a.closed
	a.rootSpan = trace.SpanContextFromContext(ctx)
	a.mu.Unlock()
	if closed {
		exit(0, "", "closed before the agent was started")
		return 0, nil
	}

	if h.s.Protocol == acp.DialectLegacy {
		// Nothing to shake hands over: the session is up as it is.
		h.pushReady(ctx, &runnerv1.Ready{Dialect: acp.DialectLegacy})
		if !a.awaitPrompt(ctx) {
			exit(0, "", "closed before the agent was started")
			return 0, nil
		}
	}
	if err := h.s.checkLaunchEnv(); err != nil {
		h.note(ctx, "refused to start the agent: %v", err)
		exit(-1, "", "refused to start the agent: "+err.Error())
		return ExitStartFailed, nil
	}
	cmd := exec.Command(h.o.Command[0], h.o.Command[1:]...)
	cmd.Env = telemetry.InjectEnv(ctx, h.o.AgentEnv)
	cmd.Dir = h.s.Workspace
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return 1, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return 1, err
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		return 1, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	err = cmd.Start()
	_ = stdinR.Close()
	_ = stdoutW.Close()
	_ = stderrW.Close()
	if err != nil {
		_ = stdinW.Close()
		_ = stdoutR.Close()
		_ = stderrR.Close()
		h.note(ctx, "could not start the agent: %v", err)
		exit(-1, "", "could not start the agent: "+err.Error())
		return ExitStartFailed, nil
	}
	a.mu.Lock()
	a.pid = cmd.Process.Pid
	halted := a.halted
	a.mu.Unlock()
	if halted {
		// Refused as it was being started.
		a.killGroup()
	}
	h.note(ctx, "started the agent (pid %d)", cmd.Process.Pid)

	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		h.relayStderr(ctx, stderrR)
	}()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var govern func(context.Context, acp.PermissionRequest) acp.PermissionAnswer
	if h.s.Permission == acp.PermissionLibrarian {
		govern = h.askRunner
	}
	client := acp.New(stdoutR, stdinW, acp.Options{
		Dialect: h.s.Protocol, Workspace: h.s.Workspace, Permission: h.s.Permission, AuthMethod: h.s.AuthMethod, MaxLine: h.s.MaxLine, Govern: govern,
		OnUpdate: a.onUpdate,
		OnDrop:   func(reason string) { h.note(ctx, "dropped a line from the agent: %s", reason) },
		Logger:   h.log,
	})
	a.mu.Lock()
	a.client = client
	closedNow := a.closed
	a.mu.Unlock()
	if closedNow {
		_ = client.Close()
	}

	turnsDone := make(chan struct{})
	go func() {
		defer close(turnsDone)
		if reason := h.handshake(ctx, client); reason != "" {
			h.note(ctx, "%s", reason)
			a.mu.Lock()
			a.why = reason
			a.mu.Unlock()
			a.killGroup()
			return
		}
		a.runTurns(ctx, client)
	}()

	var waitErr error
	select {
	case waitErr = <-waited:
	case <-ctx.Done():
		// agent-host is being stopped (its pod deleted): the agent gets
		// SIGTERM, then SIGKILL after the grace.
		h.note(ctx, "agent-host is stopping; ending the agent")
		a.signalGroup(syscall.SIGTERM)
		select {
		case waitErr = <-waited:
		case <-time.After(h.s.KillGrace):
			a.killGroup()
			waitErr = <-waited
		}
	case <-a.closeCh:
		select {
		case waitErr = <-waited:
		case <-time.After(h.s.KillGrace):
			h.note(ctx, "the agent did not exit within %s of its stdin closing; killing it", h.s.KillGrace)
			a.killGroup()
			waitErr = <-waited
		}
	}
	a.mu.Lock()
	a.exited = true
	a.mu.Unlock()
	// What the agent left in its group goes with it.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-client.Done():
	case <-time.After(orphanGrace):
	}
	_ = client.Close()
	<-turnsDone
	select {
	case <-stderrDone:
	case <-time.After(orphanGrace):
		_ = stderrR.Close()
		<-stderrDone
	}

	code, signal := 0, ""
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) {
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			signal = ws.Signal().String()
			code = -1
		}
	} else if waitErr != nil {
		code = -1
	}
	a.mu.Lock()
	reason := a.why
	a.mu.Unlock()
	switch {
	case reason != "":
	case signal != "":
		reason = "the agent was killed by " + signal
	case code != 0:
		reason = fmt.Sprintf("the agent exited with status %d", code)
	default:
		reason = "the agent exited"
	}
	if h.gateway != nil {
		h.gateway.close(reason)
	}
	exit(code, signal, reason)
	if signal != "" {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return 128 + int(ws.Signal()), nil
		}
	}
	return code, nil
}

// handshake initializes the agent and opens or loads its session, then
// pushes Ready. It returns why it failed, or "".
func (h *host) handshake(ctx context.Context, client *acp.Client) string {
	hs, cancel := context.WithTimeout(ctx, h.s.ProtocolTimeout)
	defer cancel()
	call := func(method string, fn func(ctx context.Context) error) error {
		ctx, span := h.tracer.Start(hs, "acp "+method, trace.WithSpanKind(trace.SpanKindClient))
		defer span.End()
		err := fn(ctx)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		return err
	}
	failed := func(method string, err error) string {
		outcome, reason := client.HandshakeFailure(method, err, h.s.ProtocolTimeout)
		if outcome == acp.OutcomeDeadProtocol {
			return reason
		}
		return outcome + ": " + reason
	}
	if h.s.Protocol == acp.DialectLegacy {
		return ""
	}
	if err := call("initialize", client.Initialize); err != nil {
		return failed("initialize", err)
	}
	if err := call("authenticate", func(ctx context.Context) error {
		method, err := client.Authenticate(ctx)
		if method != "" {
			h.note(ctx, "authenticated with the agent's auth method %s", method)
		}
		return err
	}); err != nil {
		return failed("authenticate", err)
	}
	sessionID, loaded := h.s.SessionID, false
	switch {
	case sessionID != "" && client.Capabilities().LoadSession:
		if err := call("session/load", func(ctx context.Context) error { return client.LoadSession(ctx, h.s.Workspace, sessionID) }); err != nil {
			return failed("session/load", err)
		}
		loaded = true
	case client.Dialect() != acp.DialectLegacy:
		if err := call("session/new", func(ctx context.Context) error {
			var err error
			sessionID, err = client.NewSession(ctx, h.s.Workspace)
			return err
		}); err != nil {
			return failed("session/new", err)
		}
	default:
		sessionID = ""
	}
	caps := client.Capabilities()
	h.pushReady(ctx, &runnerv1.Ready{SessionId: sessionID, Dialect: client.Dialect(), Loaded: loaded, LoadSession: caps.LoadSession, AgentName: caps.AgentName})
	return ""
}

// pushReady reports the session up, and keeps it for a new link.
func (h *host) pushReady(ctx context.Context, ready *runnerv1.Ready) {
	h.agent.mu.Lock()
	h.agent.ready = ready
	h.agent.mu.Unlock()
	_ = h.buf.push(ctx, &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_Ready{Ready: ready}})
	if h.gateway != nil {
		h.gateway.open(ctx)
	}
}

// awaitPrompt waits for the first prompt: a legacy agent is sent nothing,
// its whole run is the turn, so it starts when its turn is asked for
// rather than racing the prompt to its result line. It reports false when
// the runner closed the launch (or agent-host is stopping) first.
func (a *agentRun) awaitPrompt(ctx context.Context) bool {
	for {
		a.mu.Lock()
		queued := len(a.queue) > 0
		a.mu.Unlock()
		if queued {
			return true
		}
		select {
		case <-a.kick:
			// Taken here; runTurns finds the queue as it is.
		case <-a.closeCh:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// runTurns runs the queued prompts one after another until the agent is
// gone.
func (a *agentRun) runTurns(ctx context.Context, client *acp.Client) {
	for {
		a.mu.Lock()
		var t *hostTurn
		if len(a.queue) > 0 {
			t, a.queue = a.queue[0], a.queue[1:]
		}
		if t != nil && !t.cancelled {
			t.running = true
			t.clientID = client.BeginTurn()
		}
		a.mu.Unlock()
		if t == nil {
			select {
			case <-a.kick:
				continue
			case <-client.Done():
				return
			}
		}
		var ended *runnerv1.TurnEnded
		if t.cancelled {
			ended = &runnerv1.TurnEnded{Turn: t.p.GetTurn(), StopReason: acp.StopCancelled, Message: t.reason}
		} else {
			ended = a.runTurn(ctx, client, t)
		}
		a.mu.Lock()
		t.running, t.ended = false, ended
		a.order = append(a.order, t.p.GetTurn())
		if len(a.order) > maxRememberedTurns {
			delete(a.turns, a.order[0])
			a.order = a.order[1:]
		}
		a.mu.Unlock()
		_ = a.h.buf.push(ctx, &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_TurnEnded{TurnEnded: ended}})
	}
}

// runTurn sends one prompt and waits for its turn to end.
func (a *agentRun) runTurn(ctx context.Context, client *acp.Client, t *hostTurn) *runnerv1.TurnEnded {
	// The runner's turn's trace (a gateway client's), when it sent one:
	// the agent's prompt, updates and permission requests follow it.
	ctx = traceContext(ctx, t.p.GetTraceparent())
	ctx, span := a.h.tracer.Start(ctx, "acp session/prompt", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int64("conclave.turn", t.p.GetTurn())))
	defer span.End()
	a.mu.Lock()
	a.turnSpan, a.curTurn = span.SpanContext(), t.p.GetTurn()
	a.mu.Unlock()
	accept := t.p.GetAcceptTimeout().AsDuration()
	if accept <= 0 {
		accept = a.h.s.ProtocolTimeout
	}
	turn, err := client.Prompt(ctx, t.p.GetMessage(), accept)
	a.mu.Lock()
	a.turnSpan, a.curTurn = trace.SpanContext{}, 0
	a.mu.Unlock()
	ended := &runnerv1.TurnEnded{Turn: t.p.GetTurn(), StopReason: turn.StopReason, Message: turn.Message}
	switch {
	case err == nil:
	case errors.Is(err, acp.ErrAgentGone):
		ended.Failure = runnerv1.TurnFailure_TURN_FAILURE_AGENT_GONE
	case errors.Is(err, context.DeadlineExceeded):
		ended.Failure = runnerv1.TurnFailure_TURN_FAILURE_ACCEPT_TIMEOUT
	default:
		ended.Failure = runnerv1.TurnFailure_TURN_FAILURE_OTHER
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		if ended.Message == "" {
			ended.Message = err.Error()
		}
	}
	span.SetAttributes(attribute.String("acp.stop_reason", turn.StopReason))
	return ended
}

// onUpdate pushes an update; it runs on the ACP client's read loop, so a
// full buffer stops the agent's stdout from being read.
func (a *agentRun) onUpdate(ctx context.Context, u acp.Update) {
	sc := trace.SpanContextFromContext(ctx)
	a.mu.Lock()
	if !sc.IsValid() {
		sc = a.turnSpan
		if !sc.IsValid() {
			sc = a.rootSpan
		}
	}
	turn := a.curTurn
	a.mu.Unlock()
	if g := a.h.gateway; g != nil {
		// To the gateway as it happens, not through the runner.
		g.update(turn, u)
	}
	_ = a.h.buf.push(ctx, &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_Update{Update: &runnerv1.AgentUpdate{
		Kind: u.Kind, Text: u.Text, ToolCallId: u.ToolCallID, ToolName: u.ToolName, ToolStatus: u.ToolStatus,
		Progress: int32(u.Progress), Success: u.Success, SessionId: u.SessionID, Replay: u.Replay, Raw: u.Raw,
		Traceparent: traceparent(sc),
	}}})
}

// relayStderr pushes the agent's stderr line by line (a line over the
// limit is cut; bytes that are not UTF-8 are replaced).
func (h *host) relayStderr(ctx context.Context, r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readBoundedLine(br, h.s.MaxLine)
		if len(line) > 0 || err == nil {
			text := strings.ToValidUTF8(strings.TrimRight(string(line), "\r\n"), "\uFFFD")
			_ = h.buf.push(context.WithoutCancel(ctx), &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_Log{Log: &runnerv1.AgentLog{Stream: "stderr", Text: text}}})
		}
		if err != nil {
			return
		}
	}
}

// readBoundedLine reads a line, keeping at most max bytes of it.
func readBoundedLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if room := max - len(line); room > 0 {
			line = append(line, chunk[:min(len(chunk), room)]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, err
	}
}
