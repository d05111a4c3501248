package hostlink

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/covenlink"
)

// An agent in a Kubernetes Job is registered at the coven gateway by its
// agent-host, which dials the gateway's Service (the load-balanced
// endpoint) from where the agent runs: the runner does not hold a stream
// per Job agent. The runner still owns the instance's turns: a message
// that reaches the agent at the gateway goes to the runner as a
// GatewayMessage, which stores it as a turn (its record, its bus events,
// its trace) and answers with GatewayAccepted, then prompts the turn as
// any other; agent-host maps the turn's updates to the gateway as they
// happen, with covenlink's mapping, and ends the gateway request when the
// runner says how the turn ended (GatewayTurnEnded). What the runner
// itself knows of a tool call (a permission waiting for a person, then
// the decision) reaches the gateway the same way (GatewayToolState).

// maxGatewayContent bounds a gateway message relayed to the runner: it
// must fit in one event.
const maxGatewayContent = maxEventBytes / 2

// hostGateway is agent-host's side: the agent's registration at the
// gateway, and the messages waiting for the runner to take them.
type hostGateway struct {
	h   *host
	reg *covenlink.Registrar

	mu      sync.Mutex
	link    *covenlink.Link
	closed  bool
	seq     int64
	pending map[string]*gatewayWait
}

// gatewayWait is a gateway message the runner has not answered.
type gatewayWait struct {
	accepted func(turn int)
	done     chan error
}

func newHostGateway(h *host, conn grpc.ClientConnInterface) *hostGateway {
	return &hostGateway{h: h, reg: covenlink.NewRegistrar(conn, h.s.GatewayToken, h.s.GatewayHeartbeat, h.log),
		pending: map[string]*gatewayWait{}}
}

// open registers the agent, once its session is up: a message never waits
// on the agent's start. It keeps the registration (again after a gateway
// replica dies, through the load balancer, under the same id) until close.
func (g *hostGateway) open(ctx context.Context) {
	s := g.h.s
	ctx = context.WithoutCancel(ctx)
	id := s.gatewayAgentID()
	caps := s.GatewayCapabilities
	if len(caps) == 0 {
		caps = []string{"chat"}
	}
	// Tags for filtering, as the runner's own registrations have: that
	// the runner runs it, which instance and type it is.
	tags := []string{"runner", "instance:" + s.InstanceID}
	if s.AgentType != "" {
		tags = append(tags, "agent_type:"+s.AgentType)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.link != nil {
		return
	}
	g.link = g.reg.Open(covenlink.Agent{
		ID: id, Name: firstNonEmpty(s.GatewayName, id), Capabilities: caps,
		Metadata: &covenpb.AgentMetadata{
			// Where it runs is its pod.
			WorkingDirectory: s.Workspace, Hostname: g.h.o.Hostname, Os: runtime.GOOS, Backend: "acp", Workspaces: tags,
		},
		Prompt: g.prompt,
		Cancel: func(reason string) {
			// Not on the gateway stream's receiving goroutine, which a full
			// buffer would block.
			go func() {
				_ = g.h.buf.push(ctx, &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_GatewayCancel{GatewayCancel: &runnerv1.GatewayCancel{Reason: reason}}})
			}()
		},
		Note: func(text string) { g.h.note(ctx, "%s", text) },
	})
}

// prompt hands a gateway message to the runner, and waits for it to be
// stored as a turn: accepted is called with the turn's number before the
// runner's prompt for it can arrive.
func (g *hostGateway) prompt(ctx context.Context, message string, accepted func(turn int)) error {
	if len(message) > maxGatewayContent {
		return fmt.Errorf("the message is over %d bytes", maxGatewayContent)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return errors.New("the agent is ending")
	}
	g.seq++
	id := strconv.FormatInt(g.seq, 10)
	w := &gatewayWait{accepted: accepted, done: make(chan error, 1)}
	g.pending[id] = w
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.pending, id)
		g.mu.Unlock()
	}()
	// The runner may be reconnecting: it takes the message once back, if
	// within the protocol timeout.
	wait := time.NewTimer(g.h.s.ProtocolTimeout)
	defer wait.Stop()
	pushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.h.s.ProtocolTimeout)
	defer cancel()
	if err := g.h.buf.push(pushCtx, &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_GatewayMessage{GatewayMessage: &runnerv1.GatewayMessage{
		RequestId: id, Content: message, Traceparent: traceparent(trace.SpanContextFromContext(ctx)),
	}}}); err != nil {
		return fmt.Errorf("relaying the message to the runner: %w", err)
	}
	select {
	case err := <-w.done:
		return err
	case <-wait.C:
		return fmt.Errorf("the runner did not take the message within %s", g.h.s.ProtocolTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// accepted applies the runner's answer to a gateway message.
func (g *hostGateway) accepted(a *runnerv1.GatewayAccepted) {
	g.mu.Lock()
	w := g.pending[a.GetRequestId()]
	delete(g.pending, a.GetRequestId())
	g.mu.Unlock()
	if w == nil {
		// Given up on already; the turn, if stored, runs for the runner.
		return
	}
	if a.GetError() != "" || a.GetTurn() < 1 {
		w.done <- errors.New(firstNonEmpty(a.GetError(), "the runner did not store the message"))
		return
	}
	// Here, on the link's receiving goroutine, before the runner's prompt
	// for the turn (a later command) is applied: the turn's first update
	// finds its request.
	w.accepted(int(a.GetTurn()))
	w.done <- nil
}

// update maps an update of turn, the turn running, to the gateway.
func (g *hostGateway) update(turn int64, u acp.Update) {
	if l := g.current(); l != nil {
		l.Update(int(turn), u)
	}
}

// turnEnded ends the gateway request whose turn it was, as the runner
// recorded the turn's end.
func (g *hostGateway) turnEnded(e *runnerv1.GatewayTurnEnded) {
	if l := g.current(); l != nil {
		l.TurnEnded(int(e.GetTurn()), e.GetEnd(), e.GetError())
	}
}

// toolState sends the gateway request whose turn it is the runner's word
// on one of its tool calls.
func (g *hostGateway) toolState(t *runnerv1.GatewayToolState) {
	if l := g.current(); l != nil {
		l.ToolState(int(t.GetTurn()), t.GetToolCallId(), t.GetState(), t.GetDetail())
	}
}

func (g *hostGateway) current() *covenlink.Link {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.link
}

// close deregisters the agent as it ends; a message in flight ends with
// error, saying why. It is safe to call more than once.
func (g *hostGateway) close(reason string) {
	g.mu.Lock()
	l := g.link
	g.closed, g.link = true, nil
	pending := g.pending
	g.pending = map[string]*gatewayWait{}
	g.mu.Unlock()
	for _, w := range pending {
		w.done <- errors.New("the agent is ending")
	}
	if l != nil {
		l.Close(reason)
	}
}

// gatewayMessage hands a message that reached the agent at the gateway to
// the runner's session, and queues its answer. Not on the stream's
// receiving goroutine: storing the turn writes the instance's record.
func (l *Link) gatewayMessage(ctx context.Context, m *runnerv1.GatewayMessage) {
	answer := func(turn int, errText string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.gone() != nil {
			return
		}
		l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_GatewayAccepted{GatewayAccepted: &runnerv1.GatewayAccepted{
			RequestId: m.GetRequestId(), Turn: int64(turn), Error: errText}}})
	}
	if l.opts.OnGatewayMessage == nil {
		answer(0, "this instance does not take messages from the gateway")
		return
	}
	ctx = traceContext(context.WithoutCancel(ctx), m.GetTraceparent())
	go func() {
		// accepted runs before the session queues the turn's prompt, so
		// agent-host learns the turn's number before its prompt.
		if err := l.opts.OnGatewayMessage(ctx, m.GetContent(), func(turn int) { answer(turn, "") }); err != nil {
			answer(0, err.Error())
		}
	}()
}

// GatewayTurnEnded tells agent-host how turn ended, as the runner recorded
// it (covenlink.EndCompleted, EndStopped or EndFailed, and why), for the
// gateway request whose turn it was.
func (l *Link) GatewayTurnEnded(turn int, end, errText string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone() != nil {
		return
	}
	l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_GatewayTurnEnded{GatewayTurnEnded: &runnerv1.GatewayTurnEnded{
		Turn: int64(turn), End: end, Error: errText}}})
}

// GatewayToolState tells agent-host the state of a tool call of turn that
// the runner itself knows (a permission wait for a person, and its end),
// for the gateway request whose turn it is.
func (l *Link) GatewayToolState(turn int, toolCallID string, state covenpb.ToolState, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone() != nil {
		return
	}
	l.queue(&runnerv1.HostCommand{Kind: &runnerv1.HostCommand_GatewayToolState{GatewayToolState: &runnerv1.GatewayToolState{
		Turn: int64(turn), ToolCallId: toolCallID, State: state, Detail: detail}}})
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
