package hostlink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// maxEndedTurns bounds the turn results a link remembers, for a prompt
// re-sent after they ended.
const maxEndedTurns = 256

// Ready is the agent's session as agent-host reported it once it was up.
type Ready struct {
	SessionID string
	// Dialect is acp, kandev or legacy.
	Dialect string
	// Loaded: the session was resumed with session/load.
	Loaded bool
	// LoadSession: the agent can resume sessions.
	LoadSession bool
	AgentName   string
}

// Exit is how the agent ended, as agent-host reported it.
type Exit struct {
	// Code is the exit code, -1 when killed by a signal or never started.
	Code   int
	Signal string
	Reason string
}

// ErrClosed is returned by a Link's calls once it is closed or superseded.
var ErrClosed = errors.New("hostlink: the link is closed")

// ErrDetached is why a detached link's calls fail.
var ErrDetached = errors.New("hostlink: the runner let go of the link")

// Link is one expected launch's conversation with its agent-host. It
// implements the supervisor's conversation (BeginTurn, AbandonTurn,
// Prompt, CancelTurn, Done) and adds PromptTurn, Ready, Exit and Close.
// Commands sent while no host is connected wait, and go out on connect.
type Link struct {
	hub        *Hub
	instanceID string
	launch     int64
	id         string
	opts       LinkOptions

	// procMu orders event handling across a stream and its replacement,
	// so that each seq is handled once.
	procMu sync.Mutex

	mu     sync.Mutex
	stream *hostStream
	// hostID is the host process the link takes events from; acked is the
	// highest event seq handled from it.
	hostID string
	acked  int64
	// commands are sent and not yet applied by the host, in seq order.
	commands []*runnerv1.HostCommand
	cmdSeq   int64
	// cmdApplied is the highest command seq the host has applied.
	cmdApplied int64
	applied    chan struct{} // closed and replaced when cmdApplied moves

	ready    *Ready
	readyCh  chan struct{}
	exit     *Exit
	done     chan struct{}
	doneOnce sync.Once
	closing  bool
	endErr   error

	// turnIDs numbers BeginTurn's turns; turn is the one begun and not
	// ended. lastTurn is the highest durable turn number prompted.
	turnIDs  uint64
	turn     *linkTurn
	lastTurn int64
	prompted map[int64]bool
	ended    map[int64]turnResult
	endOrder []int64
	waiters  map[int64][]chan turnResult

	// asking holds the permission requests being decided, so that one
	// agent-host sends again (on a new stream) is decided once.
	asking map[permKey]bool
}

// permKey names a permission request: its agent-host process and id.
type permKey struct {
	hostID string
	id     int64
}

// linkTurn is a turn begun: a cancel before its prompt is sent keeps the
// prompt from being sent.
type linkTurn struct {
	id        uint64
	number    int64 // 0 until prompted
	cancelled bool
}

type turnResult struct {
	turn acp.Turn
	err  error
}

// InstanceID and Launch say which launch the link is for.
func (l *Link) InstanceID() string { return l.instanceID }
func (l *Link) Launch() int64      { return l.launch }

// Done is closed when the host reports that the agent exited, or the link
// is closed or superseded.
func (l *Link) Done() <-chan struct{} { return l.done }

// Exit is how the agent ended, once the host reported it; nil before.
func (l *Link) Exit() *Exit {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.exit
}

// Ready waits for the host's Ready: the agent initialized and its session
// up (new or loaded). It fails if the agent exits first (the error says
// why, e.g. a dead protocol), the link ends, or ctx ends.
func (l *Link) Ready(ctx context.Context) (Ready, error) {
	select {
	case <-l.readyCh:
		l.mu.Lock()
		defer l.mu.Unlock()
		return *l.ready, nil
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.ready != nil {
			return *l.ready, nil
		}
		if l.exit != nil {
			return Ready{}, fmt.Errorf("%w: the agent exited before its session was up: %s", acp.ErrAgentGone, l.exit.Reason)
		}
		return Ready{}, l.endErr
	case <-ctx.Done():
		return Ready{}, ctx.Err()
	}
}

// BeginTurn starts a turn without any I/O: from now on a CancelTurn
// applies to it, even before its prompt is sent.
func (l *Link) BeginTurn() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.turn == nil {
		l.turnIDs++
		l.turn = &linkTurn{id: l.turnIDs}
	}
	return l.turn.id
}

// AbandonTurn ends a turn begun with BeginTurn whose prompt will not be
// sent after all.
func (l *Link) AbandonTurn() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.turn != nil && l.turn.number == 0 {
		l.turn = nil
	}
}

// Prompt is PromptTurn for the turn after the highest one prompted on
// this link.
func (l *Link) Prompt(ctx context.Context, message string, acceptTimeout time.Duration) (acp.Turn, error) {
	l.mu.Lock()
	turn := l.lastTurn + 1
	l.mu.Unlock()
	return l.PromptTurn(ctx, turn, message, acceptTimeout)
}

// PromptTurn runs turn (the durable number the runner's records give it)
// and returns how it ended, as the host reports it. It is idempotent by
// turn: a turn the host already ran is not run again (after a runner
// restart, the pending prompt is re-sent and its result comes back).
// acceptTimeout bounds the host's acknowledgement of the prompt (and a
// kandev agent's acceptance, on the host): past it the turn fails with an
// error wrapping context.DeadlineExceeded, a dead protocol. A turn
// cancelled before its prompt was sent ends cancelled without the host
// hearing of it. An error wraps acp.ErrAgentGone when the agent exited
// mid-turn or the link ended.
func (l *Link) PromptTurn(ctx context.Context, turn int64, message string, acceptTimeout time.Duration) (acp.Turn, error) {
	if turn < 1 {
		return acp.Turn{StopReason: acp.StopError, Message: "turn must be at least 1"}, fmt.Errorf("hostlink: turn %d: must be at least 1", turn)
	}
	l.BeginTurn()
	l.mu.Lock()
	t := l.turn
	if t.cancelled {
		l.turn = nil
		l.mu.Unlock()
		return acp.Turn{StopReason: acp.StopCancelled}, nil
	}
	t.number = turn
	l.lastTurn = max(l.lastTurn, turn)
	if r, ok := l.ended[turn]; ok {
		l.turn = nil
		l.mu.Unlock()
		return r.turn, r.err
	}
	if err := l.gone(); err != nil {
		l.turn = nil
		l.mu.Unlock()
		return acp.Turn{StopReason: acp.StopError, Message: err.Error()}, err
	}
	wait := make(chan turnResult, 1)
	l.waiters[turn] = append(l.waiters[turn], wait)
	var seq int64
	if !l.prompted[turn] {
		l.prompted[turn] = true
		seq = l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_Prompt{Prompt: &runnerv1.Prompt{
			Turn: turn, Message: message, AcceptTimeout: durationpb.New(acceptTimeout),
			Traceparent: traceparent(trace.SpanContextFromContext(ctx))}}})
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.turn == t {
			l.turn = nil
		}
		l.mu.Unlock()
	}()
	if seq > 0 && acceptTimeout > 0 {
		if err := l.awaitApplied(ctx, seq, acceptTimeout); err != nil {
			return acp.Turn{StopReason: acp.StopError, Message: err.Error()}, err
		}
	}
	select {
	case r := <-wait:
		return r.turn, r.err
	case <-l.done:
		// The result may have come with the exit.
		select {
		case r := <-wait:
			return r.turn, r.err
		default:
		}
		err := l.goneErr()
		return acp.Turn{StopReason: acp.StopError, Message: err.Error()}, err
	case <-ctx.Done():
		return acp.Turn{StopReason: acp.StopError, Message: ctx.Err().Error()}, ctx.Err()
	}
}

// awaitApplied waits until the host has applied command seq.
func (l *Link) awaitApplied(ctx context.Context, seq int64, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		l.mu.Lock()
		ok, applied := l.cmdApplied >= seq, l.applied
		l.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-applied:
		case <-l.done:
			return l.goneErr()
		case <-t.C:
			return fmt.Errorf("session/prompt: agent-host did not take the prompt within %s: %w", timeout, context.DeadlineExceeded)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// CancelTurn cancels turn id (as BeginTurn numbered it) if it is still the
// turn in progress: before its prompt is sent, the prompt is not sent;
// after, the host is told (now, or when it connects) to cancel it. It does
// not wait for the turn to end.
func (l *Link) CancelTurn(_ context.Context, reason string, id uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.turn
	switch {
	case t == nil || id != 0 && t.id != id:
		return nil
	case t.number == 0:
		t.cancelled = true
		return nil
	}
	if l.gone() != nil {
		return nil
	}
	l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_Cancel{Cancel: &runnerv1.Cancel{Turn: t.number, Reason: reason}}})
	return nil
}

// Close ends the link: the host is told to close the agent's stdin (a
// well-behaved agent exits; agent-host then reports it and exits), Done
// closes, and calls in progress return acp.ErrAgentGone. The link stays
// reachable for its host until it reports the exit, or for a minute; then
// the launch is remembered as closed, and a host that connects for it is
// told to stop.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closing || l.endErr != nil {
		l.mu.Unlock()
		return nil
	}
	l.closing = true
	exited := l.exit != nil
	if !exited {
		l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_Close{Close: &runnerv1.Close{}}})
	}
	l.mu.Unlock()
	l.finish()
	if exited {
		l.hub.tombstone(l, "closed")
		return nil
	}
	time.AfterFunc(closeLinger, func() {
		l.hub.tombstone(l, "closed")
		l.end(ErrClosed, codes.PermissionDenied, "the launch was closed; stop the agent")
	})
	return nil
}

// Detach lets go of the link without telling the host to stop: its stream
// ends with Unavailable, the host keeps the agent running and its events
// buffered, and reconnects until a runner expects the launch again (the
// one that claims it next, possibly this one). Calls in progress return
// acp.ErrAgentGone.
func (l *Link) Detach() {
	l.hub.forget(l)
	l.end(ErrDetached, codes.Unavailable, "the runner let go of the launch; reconnect")
}

// queue adds a command and wakes the stream, if any. Call with mu held.
func (l *Link) queue(c *runnerv1.HostCommand) int64 {
	l.cmdSeq++
	c.Seq = l.cmdSeq
	l.commands = append(l.commands, c)
	if l.stream != nil {
		l.stream.wake()
	}
	return c.Seq
}

// gone is why the link takes no more work, or nil. Call with mu held.
func (l *Link) gone() error {
	switch {
	case l.exit != nil:
		return fmt.Errorf("session/prompt: %w: the agent exited (%s)", acp.ErrAgentGone, l.exit.Reason)
	case l.endErr != nil:
		return fmt.Errorf("session/prompt: %w: %w", acp.ErrAgentGone, l.endErr)
	case l.closing:
		return fmt.Errorf("session/prompt: %w: %w", acp.ErrAgentGone, ErrClosed)
	}
	return nil
}

func (l *Link) goneErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.gone(); err != nil {
		return err
	}
	return fmt.Errorf("session/prompt: %w", acp.ErrAgentGone)
}

// finish closes Done.
func (l *Link) finish() { l.doneOnce.Do(func() { close(l.done) }) }

// end ends the link from the runner's side (superseded, or closed and never
// heard from): Done closes and its stream, if any, stops with code.
func (l *Link) end(err error, code codes.Code, msg string) {
	l.mu.Lock()
	if l.endErr == nil {
		l.endErr = err
	}
	s := l.stream
	l.mu.Unlock()
	l.finish()
	if s != nil {
		s.stop(code, msg)
	}
}

// attach makes s the link's stream, replacing (and stopping) the one
// before, and returns the highest event seq the link has taken from the
// host process s speaks for.
func (l *Link) attach(s *hostStream, hello *runnerv1.Hello) int64 {
	l.mu.Lock()
	old := l.stream
	l.stream = s
	if hello.GetHostId() != l.hostID {
		// A host process numbers its events from 1.
		l.hostID, l.acked = hello.GetHostId(), 0
	}
	if hello.GetLinkId() == l.id {
		// Commands it has applied need not be sent again.
		l.applyUpTo(hello.GetLastCommandSeq())
	}
	s.sentAck = l.acked
	acked := l.acked
	l.mu.Unlock()
	if old != nil {
		old.stop(codes.Aborted, "replaced by a newer connection of the same agent-host")
	}
	return acked
}

func (l *Link) detach(s *hostStream) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stream == s {
		l.stream = nil
	}
}

// applyUpTo drops the commands the host has applied. Call with mu held.
func (l *Link) applyUpTo(seq int64) {
	if seq <= l.cmdApplied {
		return
	}
	l.cmdApplied = min(seq, l.cmdSeq)
	i := 0
	for i < len(l.commands) && l.commands[i].GetSeq() <= l.cmdApplied {
		i++
	}
	l.commands = l.commands[i:]
	if l.applied != nil {
		close(l.applied)
	}
	l.applied = make(chan struct{})
}

// waitEventInProgress returns once the event being handled, if any, is.
func (l *Link) waitEventInProgress() {
	l.procMu.Lock()
	defer l.procMu.Unlock()
}

// handle takes one message from the host on stream s.
func (l *Link) handle(ctx context.Context, s *hostStream, m *runnerv1.ConnectRequest) error {
	switch k := m.GetMessage().(type) {
	case *runnerv1.ConnectRequest_Heartbeat:
		return nil
	case *runnerv1.ConnectRequest_CommandAck:
		l.mu.Lock()
		if k.CommandAck.GetSeq() > l.cmdSeq {
			l.mu.Unlock()
			return statusInvalid("command_ack %d: no such command was sent", k.CommandAck.GetSeq())
		}
		l.applyUpTo(k.CommandAck.GetSeq())
		l.mu.Unlock()
		return nil
	case *runnerv1.ConnectRequest_Event:
		if err := checkEvent(k.Event); err != nil {
			return statusInvalid("%v", err)
		}
		l.procMu.Lock()
		defer l.procMu.Unlock()
		l.mu.Lock()
		if l.stream != s || s.isStopped() {
			// Replaced or stopping: the next stream re-sends what is
			// unacknowledged.
			l.mu.Unlock()
			return statusAborted("the stream is ending; reconnect")
		}
		dup := k.Event.GetSeq() <= l.acked
		l.mu.Unlock()
		if !dup {
			l.event(ctx, k.Event)
		}
		l.mu.Lock()
		l.acked = max(l.acked, k.Event.GetSeq())
		l.mu.Unlock()
		s.wake()
		return nil
	default:
		return statusInvalid("a hello is only the first message")
	}
}

// event applies one new event.
func (l *Link) event(ctx context.Context, e *runnerv1.HostEvent) {
	switch k := e.GetKind().(type) {
	case *runnerv1.HostEvent_Ready:
		l.mu.Lock()
		if l.ready == nil {
			r := k.Ready
			l.ready = &Ready{SessionID: r.GetSessionId(), Dialect: r.GetDialect(), Loaded: r.GetLoaded(), LoadSession: r.GetLoadSession(), AgentName: r.GetAgentName()}
			close(l.readyCh)
		}
		l.mu.Unlock()
	case *runnerv1.HostEvent_Update:
		u := k.Update
		// Not the stream's context: a reconnect must not cancel what the
		// update starts (a status write).
		l.opts.OnUpdate(traceContext(context.WithoutCancel(ctx), u.GetTraceparent()), acp.Update{
			Kind: u.GetKind(), Text: u.GetText(), ToolCallID: u.GetToolCallId(), ToolName: u.GetToolName(), ToolStatus: u.GetToolStatus(),
			Progress: int(u.GetProgress()), Success: u.GetSuccess(), SessionID: u.GetSessionId(), Replay: u.GetReplay(), Raw: u.GetRaw(),
		})
	case *runnerv1.HostEvent_Log:
		l.opts.OnLog(k.Log.GetStream(), k.Log.GetText())
	case *runnerv1.HostEvent_TurnEnded:
		te := k.TurnEnded
		r := turnResult{turn: acp.Turn{StopReason: te.GetStopReason(), Message: te.GetMessage()}}
		switch te.GetFailure() {
		case runnerv1.TurnFailure_TURN_FAILURE_AGENT_GONE:
			r.err = fmt.Errorf("session/prompt: %w: %s", acp.ErrAgentGone, te.GetMessage())
		case runnerv1.TurnFailure_TURN_FAILURE_ACCEPT_TIMEOUT:
			r.err = fmt.Errorf("session/prompt: %s: %w", te.GetMessage(), context.DeadlineExceeded)
		case runnerv1.TurnFailure_TURN_FAILURE_OTHER:
			r.err = fmt.Errorf("session/prompt: %s", te.GetMessage())
		}
		l.mu.Lock()
		n := te.GetTurn()
		if _, seen := l.ended[n]; !seen {
			l.ended[n] = r
			l.endOrder = append(l.endOrder, n)
			if len(l.endOrder) > maxEndedTurns {
				delete(l.ended, l.endOrder[0])
				l.endOrder = l.endOrder[1:]
			}
		}
		for _, w := range l.waiters[n] {
			w <- r
		}
		delete(l.waiters, n)
		l.mu.Unlock()
	case *runnerv1.HostEvent_PermissionRequest:
		l.permission(ctx, k.PermissionRequest)
	case *runnerv1.HostEvent_GatewayMessage:
		l.gatewayMessage(ctx, k.GatewayMessage)
	case *runnerv1.HostEvent_GatewayCancel:
		if l.opts.OnGatewayCancel != nil {
			l.opts.OnGatewayCancel(k.GatewayCancel.GetReason())
		}
	case *runnerv1.HostEvent_Exited:
		x := k.Exited
		l.mu.Lock()
		if l.exit == nil {
			l.exit = &Exit{Code: int(x.GetExitCode()), Signal: x.GetSignal(), Reason: x.GetReason()}
		}
		l.mu.Unlock()
		l.finish()
		l.hub.tombstone(l, "the agent exited")
	}
}

// permission decides a permission request on a goroutine of its own (a
// person may take hours; events go on meanwhile), once per request, and
// queues the answer as a command.
func (l *Link) permission(ctx context.Context, p *runnerv1.PermissionRequest) {
	l.mu.Lock()
	key := permKey{l.hostID, p.GetId()}
	if l.asking[key] || l.gone() != nil {
		l.mu.Unlock()
		return
	}
	l.asking[key] = true
	l.mu.Unlock()
	// Not the stream's context (a reconnect must not end the wait), but
	// the link's: its end (the agent gone, the launch detached) ends it.
	ctx, cancel := context.WithCancel(traceContext(context.WithoutCancel(ctx), p.GetTraceparent()))
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		defer cancel()
		a := l.opts.OnPermission(ctx, PermissionRequest{Params: p.GetParams(), Workspace: p.GetWorkspace(), Turn: p.GetTurn()})
		meta, _ := json.Marshal(a.Meta)
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.asking, key)
		if l.gone() != nil {
			return
		}
		l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_PermissionAnswer{PermissionAnswer: &runnerv1.PermissionAnswer{
			Id: key.id, HostId: key.hostID, Allow: a.Allow, Meta: meta}}})
	}()
}
