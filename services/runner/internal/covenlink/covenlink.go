// Package covenlink registers the agents the runner starts at the coven
// gateway, each as a coven agent over its own AgentStream, and maps the
// two protocols: a coven SendMessage becomes an ACP prompt turn, the
// turn's session/update notifications become MessageResponse events, and a
// CancelRequest becomes session/cancel (docs/runner-agents.md, "On the gateway").
package covenlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// traceContext reads SendMessage's trace_context: fixed, as the gateway
// writes it, rather than the deployment's global propagator.
var traceContext propagation.TraceContext

// Registrar opens the links of one runner replica, over one connection to
// the gateway's load-balanced address.
type Registrar struct {
	client covenpb.CovenControlClient
	token  string
	log    *slog.Logger
	// minBackoff and maxBackoff bound the wait before a link registers
	// again after its stream ended or its registration was refused.
	minBackoff, maxBackoff time.Duration
	// heartbeat is how often each link sends a Heartbeat; 0: never.
	heartbeat time.Duration
}

// NewRegistrar returns a Registrar over conn; token, when set, is every
// link's bearer token (a pattern token of the gateway's
// CONCLAVE_GATEWAY_AGENT_TOKENS, such as "*=token"); each link heartbeats
// every heartbeat (0: never).
func NewRegistrar(conn grpc.ClientConnInterface, token string, heartbeat time.Duration, logger *slog.Logger) *Registrar {
	return &Registrar{client: covenpb.NewCovenControlClient(conn), token: token, log: logger,
		minBackoff: 200 * time.Millisecond, maxBackoff: 5 * time.Second, heartbeat: heartbeat}
}

// Agent is what a link registers, and the session it drives.
type Agent struct {
	ID           string
	Name         string
	Capabilities []string
	Metadata     *covenpb.AgentMetadata
	// Prompt stores message as a turn of the session. accepted is called
	// with the turn's number once it is stored, before the turn can begin.
	Prompt func(ctx context.Context, message string, accepted func(turn int)) error
	// Cancel cancels the turn in progress.
	Cancel func(reason string)
	// Note writes a line in the instance's log.
	Note func(text string)
}

// Turn endings, as the runner records them.
const (
	EndCompleted = "completed"
	EndStopped   = "stopped"
	EndFailed    = "failed"
)

// request is a SendMessage whose turn has not ended.
type request struct {
	id, thread string
	// turn is the turn's number, once its prompt is stored; 0 before.
	turn      int
	full      []byte
	cancelled string
}

// Link is one agent's registration: it holds the agent's AgentStream, and
// registers again whenever the stream ends, until Close.
type Link struct {
	r     *Registrar
	agent Agent
	log   *slog.Logger
	ctx   context.Context
	stop  context.CancelFunc
	ended chan struct{}

	mu sync.Mutex
	// stream is the registered stream, nil between registrations.
	stream covenpb.CovenControl_AgentStreamClient
	// sendMu orders Sends on stream (a gRPC stream takes one at a time).
	sendMu sync.Mutex
	cur    *request
	// idle is closed, and replaced, whenever cur ends: a Shutdown waits on
	// it before the stream is closed.
	idle    chan struct{}
	closing bool
}

// Open registers a, and keeps it registered until Close.
func (r *Registrar) Open(a Agent) *Link {
	ctx, stop := context.WithCancel(context.Background())
	if r.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.token)
	}
	l := &Link{r: r, agent: a, log: r.log.With("agent_id", a.ID), ctx: ctx, stop: stop, ended: make(chan struct{})}
	go l.run()
	return l
}

// Close ends the registration: a request in flight ends with error, and
// the stream is closed, which deregisters the agent. It returns once the
// link has stopped.
func (l *Link) Close(reason string) {
	l.mu.Lock()
	l.closing = true
	cur := l.cur
	l.mu.Unlock()
	if cur != nil {
		l.end(cur, &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Error{Error: "the agent stopped: " + reason}})
	}
	l.mu.Lock()
	st := l.stream
	l.mu.Unlock()
	if st != nil {
		// A clean goodbye: the gateway deregisters the agent before it
		// ends the stream.
		l.sendMu.Lock()
		_ = st.CloseSend()
		l.sendMu.Unlock()
		select {
		case <-l.ended:
		case <-time.After(5 * time.Second):
		}
	}
	l.stop()
	<-l.ended
}

func (l *Link) run() {
	defer close(l.ended)
	bo := backoff{min: l.r.minBackoff, max: l.r.maxBackoff}
	for {
		welcomed, err := l.session()
		if l.ctx.Err() != nil || l.isClosing() {
			return
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.Unauthenticated, codes.PermissionDenied:
			// Registering again cannot fix an id or a credential.
			l.log.Error("runner: the gateway refused the agent; it is not reachable through the gateway", "error", err)
			l.agent.Note("the gateway refused the agent: " + statusMessage(err))
			return
		}
		if welcomed {
			bo.reset()
		}
		wait := bo.next()
		l.log.Warn("runner: the agent's gateway stream ended; registering again", "error", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (l *Link) isClosing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closing
}

// session is one AgentStream, from its opening to its end.
func (l *Link) session() (welcomed bool, err error) {
	sctx, abort := context.WithCancel(l.ctx)
	defer abort()
	st, err := l.r.client.AgentStream(sctx)
	if err != nil {
		return false, fmt.Errorf("open AgentStream: %w", err)
	}
	w, err := register(st, &covenpb.RegisterAgent{AgentId: l.agent.ID, Name: l.agent.Name, Capabilities: l.agent.Capabilities,
		Metadata: l.agent.Metadata, ProtocolFeatures: []string{"cancellation"}})
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		_ = st.CloseSend()
		return true, nil
	}
	l.stream = st
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.stream = nil
		cur := l.cur
		l.mu.Unlock()
		if cur != nil {
			// Its caller was told by the gateway (UNAVAILABLE); the turn
			// goes on in the runner, and its events have nowhere to go.
			l.endQuietly(cur)
		}
	}()
	go l.heartbeat(sctx, st)
	l.log.Info("runner: agent registered at the gateway", "server_id", w.GetServerId(), "connection", w.GetInstanceId())
	l.agent.Note(fmt.Sprintf("registered at the gateway as coven agent %s (replica %s)", l.agent.ID, w.GetServerId()))
	for {
		m, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return true, nil
			}
			return true, err
		}
		switch p := m.GetPayload().(type) {
		case *covenpb.ServerMessage_SendMessage:
			l.send(st, p.SendMessage)
		case *covenpb.ServerMessage_CancelRequest:
			l.cancel(p.CancelRequest)
		case *covenpb.ServerMessage_Shutdown:
			// The replica is draining: the turn in flight ends here, then
			// the stream closes and the agent registers again through
			// the load balancer, on another replica.
			l.log.Info("runner: the gateway replica is shutting down; the agent moves once its turn ends", "reason", p.Shutdown.GetReason())
			l.awaitIdle(st.Context())
			l.sendMu.Lock()
			_ = st.CloseSend()
			l.sendMu.Unlock()
		}
	}
}

// heartbeat sends a Heartbeat on st every r.heartbeat until ctx ends:
// coven makes heartbeats optional, but a gateway with an agent timeout
// (CONCLAVE_GATEWAY_AGENT_TIMEOUT) drops an agent silent for that long.
func (l *Link) heartbeat(ctx context.Context, st covenpb.CovenControl_AgentStreamClient) {
	if l.r.heartbeat <= 0 {
		return
	}
	t := time.NewTicker(l.r.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.sendMu.Lock()
			err := st.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{TimestampMs: now.UnixMilli()}}})
			l.sendMu.Unlock()
			if err != nil {
				return
			}
		}
	}
}

// awaitIdle waits for the request in flight, if any, to end.
func (l *Link) awaitIdle(ctx context.Context) {
	l.mu.Lock()
	if l.cur == nil {
		l.mu.Unlock()
		return
	}
	if l.idle == nil {
		l.idle = make(chan struct{})
	}
	idle := l.idle
	l.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

// send starts a SendMessage's turn; the gateway sends one at a time.
func (l *Link) send(st covenpb.CovenControl_AgentStreamClient, m *covenpb.SendMessage) {
	req := &request{id: m.GetRequestId(), thread: m.GetThreadId()}
	l.mu.Lock()
	if l.cur != nil {
		// The gateway sends the next request once the previous one ended,
		// or after its cancel grace; the earlier one's events stop here.
		old := l.cur
		l.cur = nil
		l.mu.Unlock()
		l.endQuietly(old)
		l.mu.Lock()
	}
	l.cur = req
	l.mu.Unlock()
	// ACP has no threads: every thread_id is the instance's one session,
	// whose history the agent keeps.
	l.agent.Note(fmt.Sprintf("gateway request %s (thread %q, from %q): a prompt turn", req.id, req.thread, m.GetSender()))
	// The client's trace, in Conclave's trace_context extension of
	// SendMessage (docs/runner-agents.md): the AgentStream's own gRPC metadata is
	// the stream's, not the message's.
	ctx := traceContext.Extract(l.ctx, propagation.MapCarrier(m.GetTraceContext()))
	err := l.agent.Prompt(ctx, m.GetContent(), func(turn int) {
		l.mu.Lock()
		req.turn = turn
		l.mu.Unlock()
	})
	if err != nil {
		l.end(req, &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Error{Error: "the agent cannot take the message now: " + err.Error()}})
	}
}

func (l *Link) cancel(c *covenpb.CancelRequest) {
	l.mu.Lock()
	cur := l.cur
	if cur == nil || cur.id != c.GetRequestId() {
		l.mu.Unlock()
		return
	}
	cur.cancelled = c.GetReason()
	if cur.cancelled == "" {
		cur.cancelled = "cancelled through the gateway"
	}
	l.mu.Unlock()
	l.agent.Cancel(cur.cancelled)
}

// Update maps an update of turn to the request whose turn it is, if any.
// It runs on the session's read loop, in order.
func (l *Link) Update(turn int, u acp.Update) {
	if u.Replay {
		return
	}
	l.mu.Lock()
	cur := l.cur
	if cur == nil || cur.turn != turn || turn == 0 {
		l.mu.Unlock()
		return
	}
	events := mapUpdate(u)
	for _, e := range events {
		if t, ok := e.GetEvent().(*covenpb.MessageResponse_Text); ok {
			cur.full = append(cur.full, t.Text...)
		}
	}
	l.mu.Unlock()
	for _, e := range events {
		e.RequestId = cur.id
		l.sendEvent(e)
	}
}

// ToolState sends the request whose turn it is a tool_state of the tool
// call id: the runner's own word on a tool call, beyond what the agent
// said (a permission wait escalated to a person, and its end).
func (l *Link) ToolState(turn int, id string, state covenpb.ToolState, detail string) {
	l.mu.Lock()
	cur := l.cur
	if cur == nil || cur.turn != turn || turn == 0 || id == "" {
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	ts := &covenpb.ToolStateUpdate{Id: utf8Only(id), State: state}
	if detail != "" {
		ts.Detail = &detail
	}
	l.sendEvent(&covenpb.MessageResponse{RequestId: cur.id, Event: &covenpb.MessageResponse_ToolState{ToolState: ts}})
}

// TurnEnded ends the request whose turn it was: end is how the runner
// recorded the turn (EndCompleted, EndStopped, EndFailed), errText why.
func (l *Link) TurnEnded(turn int, end, errText string) {
	l.mu.Lock()
	cur := l.cur
	if cur == nil || cur.turn != turn || turn == 0 {
		l.mu.Unlock()
		return
	}
	full, cancelled := string(cur.full), cur.cancelled
	l.mu.Unlock()
	var e *covenpb.MessageResponse
	switch {
	case end == EndCompleted && errText == "":
		e = &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: full}}}
	case end == EndStopped:
		reason := cancelled
		if reason == "" {
			reason = firstNonEmpty(errText, "the turn was cancelled")
		}
		e = &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Cancelled{Cancelled: &covenpb.Cancelled{Reason: reason}}}
	default:
		e = &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Error{Error: firstNonEmpty(errText, "the turn failed")}}
	}
	l.end(cur, e)
}

// end sends e, which ends req, if req is still the request in flight.
func (l *Link) end(req *request, e *covenpb.MessageResponse) {
	if !l.clear(req) {
		return
	}
	e.RequestId = req.id
	l.sendEvent(e)
}

// endQuietly forgets req without telling its caller.
func (l *Link) endQuietly(req *request) { l.clear(req) }

func (l *Link) clear(req *request) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != req {
		return false
	}
	l.cur = nil
	if l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
	return true
}

func (l *Link) sendEvent(e *covenpb.MessageResponse) {
	l.mu.Lock()
	st := l.stream
	l.mu.Unlock()
	if st == nil {
		return
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	if err := st.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: e}}); err != nil {
		// The stream's Recv sees its end and registers again.
		l.log.Debug("runner: sending an event to the gateway", "error", err)
	}
}

// register sends RegisterAgent and waits for the gateway's answer.
func register(st covenpb.CovenControl_AgentStreamClient, reg *covenpb.RegisterAgent) (*covenpb.Welcome, error) {
	if err := st.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: reg}}); err != nil {
		if errors.Is(err, io.EOF) {
			if _, rerr := st.Recv(); rerr != nil && !errors.Is(rerr, io.EOF) {
				err = rerr
			}
		}
		return nil, fmt.Errorf("send RegisterAgent: %w", err)
	}
	m, err := st.Recv()
	if err != nil {
		return nil, fmt.Errorf("await Welcome: %w", err)
	}
	switch p := m.GetPayload().(type) {
	case *covenpb.ServerMessage_Welcome:
		return p.Welcome, nil
	case *covenpb.ServerMessage_RegistrationError:
		// The stream's status that follows says whether to retry
		// (ALREADY_EXISTS while the id's earlier registration lives on).
		if _, err := st.Recv(); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("registration refused: %w", err)
		}
		return nil, fmt.Errorf("registration refused: %s", p.RegistrationError.GetReason())
	default:
		return nil, fmt.Errorf("expected Welcome, got %T", p)
	}
}

// backoff is exponential with jitter, so that the agents of one replica
// that died do not all register again at the same instant.
type backoff struct {
	min, max, window time.Duration
}

func (b *backoff) next() time.Duration {
	if b.window == 0 {
		b.window = b.min
	} else {
		b.window = min(2*b.window, b.max)
	}
	return b.window/2 + mrand.N(b.window/2+1)
}

func (b *backoff) reset() { b.window = 0 }

// statusMessage is the message of the gRPC status err wraps.
func statusMessage(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Message()
	}
	return err.Error()
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
