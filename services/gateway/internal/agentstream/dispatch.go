package agentstream

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// Event is one step of an agent's reply: a response from the agent, or the
// error that ended the request without one (the agent disconnected, the
// gateway shut down).
type Event struct {
	Response *covenpb.MessageResponse
	Err      error
}

// Request is a caller's view of a message sent to an agent.
type Request struct {
	// ID is the gateway-assigned request ID, the one the agent echoes.
	ID string
	// Events delivers the reply in order and is closed after the event that
	// ends it: a response with done, error or cancelled, or an Err.
	Events <-chan Event

	req *request
}

// Abandon makes sure the message is never sent to the agent, if it has not
// been yet, and reports whether it was not: then the agent never saw it,
// and sending it again cannot make the agent see it twice.
func (r *Request) Abandon() bool {
	return r.req.state.CompareAndSwap(requestQueued, requestAbandoned) || r.req.state.Load() == requestAbandoned
}

// A request's state moves from queued to dispatched (the dispatcher took it)
// or to abandoned (its caller gave it up first), never back.
const (
	requestQueued int32 = iota
	requestDispatched
	requestAbandoned
)

// request is the gateway's side of a Request. The caller's side (events)
// and the agent's side (agentDone) end separately: a caller may leave or
// cancel while the agent is still working, and the agent is sent nothing new
// until it has ended the request too.
type request struct {
	msg    *covenpb.SendMessage
	caller context.Context
	events chan Event

	sendMu sync.Mutex // serializes deliveries with the close of events
	closed chan struct{}

	agentDone  chan struct{}
	agentOnce  sync.Once
	cancelSent atomic.Bool
	state      atomic.Int32
}

func newRequest(ctx context.Context, msg *covenpb.SendMessage) *request {
	return &request{msg: msg, caller: ctx, events: make(chan Event, 16), closed: make(chan struct{}), agentDone: make(chan struct{})}
}

// deliver hands ev to the caller, waiting while the caller is slow (which
// slows the agent through gRPC flow control) but not after it has gone. An
// event that ends the request closes the caller's side.
func (r *request) deliver(ev Event) {
	r.sendMu.Lock()
	defer r.sendMu.Unlock()
	select {
	case <-r.closed:
		return
	default:
	}
	select {
	case r.events <- ev:
	case <-r.caller.Done():
	}
	if ev.Err != nil || isTerminal(ev.Response) {
		close(r.events)
		close(r.closed)
	}
}

func (r *request) callerClosed() bool {
	select {
	case <-r.closed:
		return true
	default:
		return r.caller.Err() != nil
	}
}

func (r *request) endAgent() { r.agentOnce.Do(func() { close(r.agentDone) }) }

func (r *request) agentEnded() bool {
	select {
	case <-r.agentDone:
		return true
	default:
		return false
	}
}

func isTerminal(m *covenpb.MessageResponse) bool {
	switch m.GetEvent().(type) {
	case *covenpb.MessageResponse_Done, *covenpb.MessageResponse_Error, *covenpb.MessageResponse_Cancelled:
		return true
	}
	return false
}

// NewRequestID returns a fresh request ID naming serverID as the replica
// that assigned it, which is where CancelMessage is routed.
func NewRequestID(serverID string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return serverID + "." + hex.EncodeToString(b[:])
}

// Send queues msg for agentID and returns the request whose events carry the
// agent's reply. The agent handles one request at a time; up to QueueDepth
// more wait, and past that Send fails with RESOURCE_EXHAUSTED. When ctx ends
// before the reply does, the caller is detached and, if the agent supports
// cancellation, the agent is told to stop. A msg.RequestId already set (from
// NewRequestID) is kept; otherwise one is assigned.
func (s *Service) Send(ctx context.Context, agentID string, msg *covenpb.SendMessage) (*Request, error) {
	if msg.RequestId == "" {
		msg.RequestId = NewRequestID(s.opts.ServerID)
	}
	// The caller's trace goes with the message (Conclave's trace_context
	// extension, in W3C Trace Context form whatever the deployment's
	// propagator): an AgentStream's gRPC metadata is the agent's, set once
	// for every message it will get.
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, tc)
	if len(tc) > 0 {
		msg.TraceContext = tc
	}
	r := newRequest(ctx, msg)
	s.mu.Lock()
	a, ok := s.agents[agentID]
	switch {
	case s.draining:
		s.mu.Unlock()
		return nil, errDraining
	case !ok:
		s.mu.Unlock()
		return nil, status.Errorf(codes.NotFound, "agent %q is not connected", agentID)
	}
	// Queued under the lock deregistration takes, so a request is never
	// queued for an agent whose dispatcher has already failed what was left.
	defer s.mu.Unlock()
	if err := a.enqueue(s, r); err != nil {
		return nil, err
	}
	s.requests[msg.RequestId] = requestRef{agent: a, req: r}
	return &Request{ID: msg.RequestId, Events: r.events, req: r}, nil
}

// enqueue adds r behind the request in flight, starting a dispatcher if none
// runs.
func (a *Agent) enqueue(s *Service, r *request) error {
	depth := s.opts.QueueDepth
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) >= depth {
		return status.Errorf(codes.ResourceExhausted, "agent %q has %d requests waiting; try again later", a.ID, depth)
	}
	a.pending = append(a.pending, r)
	s.metrics.Queued(1)
	if !a.dispatching {
		if a.halt == nil {
			a.halt = make(chan struct{})
		}
		a.dispatching = true
		a.dispatchers.Add(1)
		go s.dispatch(a)
	}
	return nil
}

// next takes the request to send next; ok is false when none waits, and the
// dispatcher must then exit.
func (a *Agent) next() (r *request, stopped, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.pending) == 0 {
		a.dispatching = false
		a.pending = nil
		return nil, a.stopped, false
	}
	r = a.pending[0]
	a.pending[0] = nil
	a.pending = a.pending[1:]
	return r, a.stopped, true
}

// stop marks a deregistered agent: its dispatcher, if one runs, fails every
// request still waiting.
func (a *Agent) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	a.stopped = true
	if a.halt != nil {
		close(a.halt)
	}
}

type requestRef struct {
	agent *Agent
	req   *request
}

// Cancel cancels a request that is queued or in flight. It reports false
// when the request is unknown or already finished for its caller.
func (s *Service) Cancel(ctx context.Context, requestID, reason string) bool {
	s.mu.Lock()
	ref, ok := s.requests[requestID]
	s.mu.Unlock()
	if !ok || ref.req.callerClosed() {
		return false
	}
	ref.agent.cancelRequest(ref.req, reason)
	return true
}

// cancelRequest tells the agent to stop when it can (it answers cancelled,
// which ends the request); otherwise the caller's side ends here with a
// cancelled event and the agent's reply is discarded. A queued request never
// reaches the agent.
func (a *Agent) cancelRequest(r *request, reason string) {
	a.mu.Lock()
	inflight := a.inflight == r
	a.mu.Unlock()
	if inflight && a.supports("cancellation") {
		a.sendCancel(r, reason)
		return
	}
	r.deliver(Event{Response: &covenpb.MessageResponse{
		RequestId: r.msg.RequestId,
		Event:     &covenpb.MessageResponse_Cancelled{Cancelled: &covenpb.Cancelled{Reason: reason}},
	}})
}

func (a *Agent) sendCancel(r *request, reason string) {
	if r.cancelSent.Swap(true) {
		return
	}
	_ = a.send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_CancelRequest{
		CancelRequest: &covenpb.CancelRequest{RequestId: r.msg.RequestId, Reason: &reason},
	}})
}

func (a *Agent) supports(feature string) bool {
	return slices.Contains(a.ProtocolFeatures, feature)
}

// route delivers a response to the request in flight. It reports false for a
// response to any other request, or to one the agent already ended; those
// are dropped.
func (a *Agent) route(m *covenpb.MessageResponse) bool {
	a.mu.Lock()
	r := a.inflight
	a.mu.Unlock()
	if r == nil || r.msg.GetRequestId() != m.GetRequestId() || r.agentEnded() {
		return false
	}
	if isTerminal(m) {
		r.endAgent()
	}
	r.deliver(Event{Response: m})
	return true
}

// dispatch feeds the agent one request at a time, while any wait. Every
// request queued is seen here: one queued after the stream ended (but before
// the agent was deregistered) is failed rather than left waiting.
func (s *Service) dispatch(a *Agent) {
	defer a.dispatchers.Done()
	var ctx context.Context = a.closer
	gone := func() error {
		if st, ok := status.FromError(context.Cause(ctx)); ok && context.Cause(ctx) != nil {
			return status.Errorf(codes.Unavailable, "agent %q disconnected: %s", a.ID, st.Message())
		}
		return status.Errorf(codes.Unavailable, "agent %q disconnected", a.ID)
	}
	fail := func(r *request, err error) {
		r.deliver(Event{Err: err})
		s.forget(r)
	}
	for {
		r, stopped, ok := a.next()
		if ok {
			s.metrics.Queued(-1)
		}
		switch {
		case !ok:
			return
		case r.callerClosed():
			// Cancelled or abandoned while it waited: the agent never sees it,
			// and it stays queued for Abandon to report so.
			s.forget(r)
			continue
		case stopped || ctx.Err() != nil:
			fail(r, gone())
			continue
		}
		if !r.state.CompareAndSwap(requestQueued, requestDispatched) {
			s.forget(r) // its caller abandoned it just now
			continue
		}
		a.mu.Lock()
		a.inflight = r
		a.mu.Unlock()
		if err := a.send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_SendMessage{SendMessage: r.msg}}); err != nil {
			fail(r, status.Errorf(codes.Unavailable, "sending to agent %q: %v", a.ID, err))
		} else if !s.await(ctx, a, r) {
			fail(r, gone())
		} else {
			s.forget(r)
		}
		a.mu.Lock()
		a.inflight = nil
		a.mu.Unlock()
	}
}

// await waits until the agent ends r, and reports false if the stream ended
// first. A caller that leaves or cancels early gets the agent asked to
// cancel (when it supports it) and CancelGrace to end the request, after
// which the next request is sent regardless.
func (s *Service) await(ctx context.Context, a *Agent, r *request) bool {
	select {
	case <-r.agentDone:
		return true
	case <-ctx.Done():
		return false
	case <-a.halt:
		return false
	case <-r.caller.Done():
	case <-r.closed:
	}
	// A request the agent ended closes for its caller too, and select
	// picks among ready cases at random: an agent that answered before
	// this wait began must not be told to cancel what it has finished.
	if r.agentEnded() {
		return true
	}
	if a.supports("cancellation") {
		a.sendCancel(r, "the caller went away")
	}
	t := time.NewTimer(s.opts.CancelGrace)
	defer t.Stop()
	select {
	case <-r.agentDone:
	case <-ctx.Done():
		return false
	case <-a.halt:
		return false
	case <-t.C:
		s.log.WarnContext(ctx, "agent did not end an abandoned request in time; sending the next one",
			"agent_id", a.ID, "request_id", r.msg.RequestId, "grace", s.opts.CancelGrace)
		r.endAgent()
	}
	return true
}

func (s *Service) forget(r *request) {
	s.mu.Lock()
	delete(s.requests, r.msg.GetRequestId())
	s.mu.Unlock()
}
