// Package agentstream serves coven.CovenControl/AgentStream: the long-lived
// bidirectional stream each agent holds with the gateway (the coven protocol).
//
// It enforces the registration handshake, keeps agents' liveness, and tells
// every agent to go elsewhere when the gateway drains.
package agentstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
)

// MaxAgentIDLen bounds agent_id (ids.AgentID's rule): IDs are keys in
// logs, metrics and the registry, and a UUID needs 36 bytes.
const MaxAgentIDLen = ids.MaxBytes

// Options tune the stream's timing.
type Options struct {
	// ServerID names this gateway replica in Welcome.
	ServerID string
	// RegisterTimeout is how long a new stream may stay silent before its
	// RegisterAgent arrives.
	RegisterTimeout time.Duration
	// AgentTimeout, when positive, is how long a registered agent may stay
	// silent (no heartbeat, no response) before it is deregistered and its
	// stream closed. Zero, the default, keeps a silent agent as long as its
	// connection lives: coven makes heartbeats optional, and the transport
	// (gRPC keepalive pings, TCP keepalive) finds the dead peers.
	AgentTimeout time.Duration
	// QueueDepth is how many requests may wait for a busy agent.
	QueueDepth int
	// CancelGrace is how long an agent may take to end a request its caller
	// abandoned before the next request is sent anyway.
	CancelGrace time.Duration
	// Registry, when set, makes registrations cluster-wide.
	Registry Registry
	// InstancePrefix starts every connection's instance ID; ServerID when
	// empty. Connection IDs must not repeat across restarts of a replica.
	InstancePrefix string
	// MaxHeartbeats bounds the heartbeats (and other messages that carry no
	// reply: responses to requests not in flight, repeated registrations)
	// an agent may send in one second; past it the stream ends with
	// RESOURCE_EXHAUSTED. Replies are not counted: a streaming reply
	// legitimately sends thousands of responses a second.
	MaxHeartbeats int
	// Metrics receive the agent side's measurements; none are kept when nil.
	Metrics *metrics.Metrics
	// Authenticate, when set, checks a registering agent's credentials (the
	// stream's metadata) against its agent_id; its error, a gRPC status, ends
	// the stream after a RegistrationError.
	Authenticate func(ctx context.Context, agentID string) error
	// Now is the clock agents' silence is measured by; time.Now when nil.
	Now func() time.Time
}

// Registry records which connection holds each agent across replicas. It
// keeps the registrations alive itself, by a lease per replica, and tells
// the Service through Lost when one was taken away.
type Registry interface {
	// Claim fails with ALREADY_EXISTS while another connection holds a,
	// and with UNAVAILABLE while the replica cannot keep registrations.
	Claim(ctx context.Context, a *gatewayv1.Agent) error
	Release(ctx context.Context, agentID, instanceID string) error
}

// Agent is a registered agent as this replica holds it.
type Agent struct {
	ID               string
	Name             string
	Capabilities     []string
	Metadata         *covenpb.AgentMetadata
	ProtocolFeatures []string
	InstanceID       string
	ServerID         string
	ConnectedAt      time.Time

	lastSeen atomic.Int64 // unix nanoseconds
	conn     *agentConn
	// closer is the stream's context: it ends when the stream does, with
	// the gateway's reason as its cause when the gateway ended it.
	closer *streamCloser
	// base is the replica's logger; log adds the agent's attributes only
	// when something is logged, which spares every idle agent a logger of
	// its own.
	base *slog.Logger

	evicting atomic.Bool

	// Owned by the stream's receive loop.
	heartbeatWindow int64 // unix seconds
	heartbeats      int

	mu          sync.Mutex
	pending     []*request // waiting behind inflight; nil when idle, so an idle agent costs nothing here
	inflight    *request
	dispatching bool // a dispatcher goroutine is running; true whenever pending is not empty
	stopped     bool // deregistered: nothing new is queued, and the dispatcher fails what is left
	// halt is closed when the agent stops. It is made with the first
	// dispatcher, so an agent that never had a request waiting costs no
	// channel (nor a cancellable context of its own, which would also add
	// an entry to its parent context's children map).
	halt        chan struct{}
	dispatchers sync.WaitGroup
}

// Busy reports whether a request is in flight, and how many wait.
func (a *Agent) Busy() (inflight bool, queued int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inflight != nil, len(a.pending)
}

// Proto is the agent as the client API and the registry show it.
func (a *Agent) Proto() *gatewayv1.Agent {
	busy, queued := a.Busy()
	return &gatewayv1.Agent{
		AgentId:          a.ID,
		Name:             a.Name,
		Capabilities:     a.Capabilities,
		Metadata:         a.Metadata,
		ProtocolFeatures: a.ProtocolFeatures,
		ServerId:         a.ServerID,
		InstanceId:       a.InstanceID,
		ConnectedAt:      timestamppb.New(a.ConnectedAt),
		LastSeenAt:       timestamppb.New(a.LastSeen()),
		Busy:             busy,
		QueuedRequests:   int32(queued),
	}
}

func (a *Agent) send(m *covenpb.ServerMessage) error { return a.conn.send(m) }

// closeStream ends the agent's stream with reason, also sent as the
// closeReasonTrailer trailer; timeout marks a stream closed for silence.
func (a *Agent) closeStream(reason error, timeout bool) {
	a.closer.close(a.conn.stream, reason, timeout)
}

func (a *Agent) log() *slog.Logger {
	return a.base.With("agent_id", a.ID, "instance_id", a.InstanceID)
}

// LastSeen is when the agent last sent anything.
func (a *Agent) LastSeen() time.Time { return time.Unix(0, a.lastSeen.Load()) }

func (a *Agent) touch(now time.Time) { a.lastSeen.Store(now.UnixNano()) }

// Service implements covenpb.CovenControlServer.
type Service struct {
	covenpb.UnimplementedCovenControlServer

	opts    Options
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics.Metrics

	mu       sync.Mutex
	agents   map[string]*Agent // routable: welcomed
	joining  map[string]*Agent // reserved, not yet welcomed
	requests map[string]requestRef
	draining bool
	// shutdownReason is Shutdown's reason, once draining.
	shutdownReason string
	keeping        bool // the keeper loop runs; it does while any agent is registered, with an AgentTimeout
	nextID         atomic.Uint64
}

var _ covenpb.CovenControlServer = (*Service)(nil)

// New returns a Service. Zero timeouts take defaults, except AgentTimeout,
// whose zero is off.
func New(opts Options, logger *slog.Logger) *Service {
	if opts.RegisterTimeout <= 0 {
		opts.RegisterTimeout = 10 * time.Second
	}
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = 32
	}
	if opts.CancelGrace <= 0 {
		opts.CancelGrace = 30 * time.Second
	}
	if opts.InstancePrefix == "" {
		opts.InstancePrefix = opts.ServerID
	}
	if opts.MaxHeartbeats <= 0 {
		opts.MaxHeartbeats = 50
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.Discard()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Service{opts: opts, log: logger, now: opts.Now, metrics: opts.Metrics, agents: map[string]*Agent{}, joining: map[string]*Agent{}, requests: map[string]requestRef{}}
}

var (
	errNotRegisterFirst = status.Error(codes.FailedPrecondition, "the first message on AgentStream must be RegisterAgent")
	errDraining         = status.Error(codes.Unavailable, "gateway is shutting down; reconnect to another replica")
	errSilent           = status.Error(codes.DeadlineExceeded, "agent sent nothing within the agent timeout; deregistered")
)

type streamCloserKey struct{}

// streamCloser is an AgentStream's context, made by ServerOption before the
// stream starts: the gateway cancels it to end a stream whose handler is
// blocked in Recv (a silent agent, a lost lease), which spares a second
// goroutine per agent to wait for that decision. gRPC reports a stream
// ended that way with the context's error, so Err says DeadlineExceeded
// for a stream ended by a timeout; the specific reason travels in the
// closeReasonTrailer trailer.
type streamCloser struct {
	context.Context
	cancel  context.CancelCauseFunc
	timeout atomic.Bool
	closed  atomic.Bool
}

// Err is DeadlineExceeded for a stream closed by a timeout.
func (c *streamCloser) Err() error {
	err := c.Context.Err()
	if err != nil && c.timeout.Load() {
		return context.DeadlineExceeded
	}
	return err
}

// Value finds the closer itself under streamCloserKey.
func (c *streamCloser) Value(key any) any {
	if key == (streamCloserKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// close ends stream with reason, a status, also sent as the
// closeReasonTrailer trailer; timeout makes gRPC report DEADLINE_EXCEEDED
// rather than CANCELLED.
func (c *streamCloser) close(stream agentStream, reason error, timeout bool) {
	if !c.closed.CompareAndSwap(false, true) {
		return // the first reason stands
	}
	stream.SetTrailer(metadata.Pairs(closeReasonTrailer, status.Convert(reason).Message()))
	if timeout {
		c.timeout.Store(true)
	}
	c.cancel(reason)
}

// closeReasonTrailer carries, in the trailers, why the gateway ended an
// agent's stream while it waited for the agent: gRPC's own status message
// for such a stream is only "context canceled" or "context deadline
// exceeded".
const closeReasonTrailer = "conclave-close-reason"

// ServerOption gives every AgentStream a context the gateway can cancel;
// AgentStream needs it. gRPC makes the context returned by the tap handle
// the stream's own, so cancelling it wakes a blocked Recv.
func ServerOption() grpc.ServerOption {
	return grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if info.FullMethodName != covenpb.CovenControl_AgentStream_FullMethodName {
			return ctx, nil
		}
		c := &streamCloser{}
		c.Context, c.cancel = context.WithCancelCause(ctx)
		return c, nil
	})
}

var errNoServerOption = status.Error(codes.Internal, "gateway misconfigured: the gRPC server lacks agentstream.ServerOption")

type agentStream = grpc.BidiStreamingServer[covenpb.AgentMessage, covenpb.ServerMessage]

// AgentStream runs one agent's connection. An idle agent costs one
// goroutine, this one, blocked in Recv: liveness and leases are kept by one
// loop per replica, which ends a stream through its streamCloser, and a
// dispatcher runs only while requests wait.
func (s *Service) AgentStream(stream agentStream) error {
	closer, ok := stream.Context().Value(streamCloserKey{}).(*streamCloser)
	if !ok {
		return errNoServerOption
	}
	// As the coven protocol asks, headers go out as soon as the stream opens, before the agent
	// speaks, so clients that wait for them do not deadlock.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	// The handler's context is the stream's own: a dispatcher learns that
	// the handler returned from Agent.stop, not from a context of its own.
	var ctx context.Context = closer

	reg, err := s.awaitRegister(ctx, closer, stream)
	if err != nil {
		s.metrics.Registered(metrics.Invalid)
		return err
	}
	// Registration runs the deepest code an agent's stream meets (the
	// store's client, logging); on a goroutine of its own, it does not
	// leave this long-lived goroutine with a stack grown for it.
	type admission struct {
		agent *Agent
		err   error
	}
	admitted := make(chan admission, 1)
	go func() {
		a, err := s.admit(ctx, closer, stream, reg)
		admitted <- admission{a, err}
	}()
	adm := <-admitted
	if adm.agent == nil {
		return adm.err
	}
	// Deregistered first, so no new request can be queued; then the
	// dispatcher fails the pending ones before the stream ends, so no caller
	// is left waiting and the agent can reconnect at once.
	defer func() {
		s.deregister(adm.agent)
		adm.agent.stop()
		adm.agent.dispatchers.Wait()
	}()
	if adm.err != nil {
		return adm.err
	}
	return s.serve(ctx, adm.agent, stream)
}

// awaitRegister reads the first message, which must be a valid
// RegisterAgent, within RegisterTimeout: a stream left open and silent does
// not hold a slot for long.
func (s *Service) awaitRegister(ctx context.Context, closer *streamCloser, stream agentStream) (*covenpb.RegisterAgent, error) {
	timer := time.AfterFunc(s.opts.RegisterTimeout, func() {
		closer.close(stream, status.Errorf(codes.DeadlineExceeded, "no RegisterAgent within %s", s.opts.RegisterTimeout), true)
	})
	m, err := stream.Recv()
	if !timer.Stop() {
		// The timeout closed the stream as the message arrived.
		return nil, closedBecause(ctx, status.Error(codes.DeadlineExceeded, "no RegisterAgent in time"))
	}
	switch {
	case errors.Is(err, io.EOF):
		return nil, status.Error(codes.FailedPrecondition, "stream closed before RegisterAgent")
	case err != nil:
		return nil, closedBecause(ctx, err)
	}
	reg := m.GetRegister()
	if reg == nil {
		return nil, errNotRegisterFirst
	}
	if err := ids.AgentID.Check(reg.GetAgentId()); err != nil {
		// The client API takes the same ids, so every agent that registers
		// can be reached. Coven's RegistrationError says why first.
		st := status.New(codes.InvalidArgument, "RegisterAgent."+err.Error())
		_ = stream.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_RegistrationError{
			RegistrationError: &covenpb.RegistrationError{Reason: st.Message()},
		}})
		return nil, st.Err()
	}
	return reg, nil
}

// closedBecause says why Recv failed: the gateway's reason when it closed
// the stream, else recvErr.
func closedBecause(ctx context.Context, recvErr error) error {
	if cause := context.Cause(ctx); cause != nil {
		if _, ok := status.FromError(cause); ok {
			return cause
		}
		return status.FromContextError(cause).Err()
	}
	return recvErr
}

// agentConn serializes sends: the dispatcher, cancellations and Shutdown
// all send, and a gRPC stream allows one sender at a time.
type agentConn struct {
	mu     sync.Mutex
	stream agentStream
}

func (c *agentConn) send(m *covenpb.ServerMessage) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stream.Send(m)
}

// admit authenticates and registers the agent and welcomes it. A refused
// agent is sent RegistrationError, and admit returns no agent and the
// status that ends its stream; an error with an agent means it was
// registered and must be deregistered.
func (s *Service) admit(ctx context.Context, closer *streamCloser, stream agentStream, reg *covenpb.RegisterAgent) (*Agent, error) {
	conn := &agentConn{stream: stream}
	refuse := func(err error) error {
		_ = conn.send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_RegistrationError{
			RegistrationError: &covenpb.RegistrationError{Reason: status.Convert(err).Message()},
		}})
		return err
	}
	if s.opts.Authenticate != nil {
		if err := s.opts.Authenticate(ctx, reg.GetAgentId()); err != nil {
			s.log.WarnContext(ctx, "agent registration refused", "agent_id", reg.GetAgentId(), "error", err)
			if status.Code(err) == codes.Unauthenticated {
				s.metrics.Registered(metrics.Unauthenticated)
			} else {
				s.metrics.Registered(metrics.Denied)
			}
			return nil, refuse(err)
		}
	}
	now := s.now()
	agent := &Agent{
		ID:               reg.GetAgentId(),
		Name:             reg.GetName(),
		Capabilities:     reg.GetCapabilities(),
		Metadata:         reg.GetMetadata(),
		ProtocolFeatures: reg.GetProtocolFeatures(),
		InstanceID:       fmt.Sprintf("%s-%d", s.opts.InstancePrefix, s.nextID.Add(1)),
		ServerID:         s.opts.ServerID,
		ConnectedAt:      now,
		conn:             conn,
		closer:           closer,
	}
	agent.base = s.log
	agent.touch(now)
	if err := s.reserve(ctx, agent); err != nil {
		if status.Code(err) == codes.AlreadyExists {
			s.metrics.Registered(metrics.Duplicate)
		} else {
			s.metrics.Registered(metrics.Unavailable)
		}
		return nil, refuse(err)
	}
	// Routable from here on; holding the send lock makes Welcome the first
	// message the agent gets, before any request.
	conn.mu.Lock()
	draining := s.promote(agent)
	err := stream.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Welcome{Welcome: &covenpb.Welcome{
		ServerId: s.opts.ServerID, AgentId: agent.ID, InstanceId: agent.InstanceID,
	}}})
	conn.mu.Unlock()
	if err != nil {
		return agent, closedBecause(ctx, err)
	}
	s.metrics.Registered(metrics.Welcome)
	agent.log().InfoContext(ctx, "agent registered", "name", agent.Name, "capabilities", agent.Capabilities)
	if draining {
		// Shutdown began after the reservation; this agent missed it.
		_ = agent.send(s.shutdownMessage())
	}
	return agent, nil
}

// serve reads the registered agent's messages until the stream ends.
func (s *Service) serve(ctx context.Context, agent *Agent, stream agentStream) error {
	for {
		m, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			agent.log().InfoContext(ctx, "agent disconnected")
			return nil
		case err != nil:
			err = closedBecause(ctx, err)
			agent.log().InfoContext(ctx, "agent stream ended", "reason", err)
			return err
		}
		agent.touch(s.now())
		if err := s.handle(ctx, agent, m); err != nil {
			agent.log().WarnContext(ctx, "agent stream closed by the gateway", "reason", err)
			return err
		}
	}
}

// handle acts on one message from a registered agent. Its error, a status,
// ends the stream.
func (s *Service) handle(ctx context.Context, a *Agent, m *covenpb.AgentMessage) error {
	if p, ok := m.GetPayload().(*covenpb.AgentMessage_Response); ok {
		if a.route(p.Response) {
			return nil
		}
		// Never delivered elsewhere: it may be someone else's. Counted
		// below with heartbeats, so that a flood of them is bounded too.
		s.metrics.Dropped()
		a.log().WarnContext(ctx, "dropped response for a request not in flight", "request_id", p.Response.GetRequestId())
	}
	if sec := s.now().Unix(); sec != a.heartbeatWindow {
		a.heartbeatWindow, a.heartbeats = sec, 0
	}
	if a.heartbeats++; a.heartbeats > s.opts.MaxHeartbeats {
		s.metrics.Evicted(metrics.HeartbeatFlood)
		return status.Errorf(codes.ResourceExhausted, "agent %q sent more than %d heartbeats in one second; one every few seconds is plenty", a.ID, s.opts.MaxHeartbeats)
	}
	switch m.GetPayload().(type) {
	case *covenpb.AgentMessage_Heartbeat, *covenpb.AgentMessage_Response:
		// Liveness was renewed by the receipt itself.
	case *covenpb.AgentMessage_Register:
		a.log().WarnContext(ctx, "ignored repeated RegisterAgent")
	default:
		a.log().WarnContext(ctx, "ignored empty AgentMessage")
	}
	return nil
}

// reserve claims a.ID for a, on this replica and then cluster-wide. A
// reserved agent is not yet routable: nothing is sent to it before
// Welcome, which promote follows.
func (s *Service) reserve(ctx context.Context, a *Agent) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return errDraining
	}
	if _, dup := s.agents[a.ID]; dup || s.joining[a.ID] != nil {
		s.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "agent %q is already connected", a.ID)
	}
	s.joining[a.ID] = a
	s.mu.Unlock()
	if s.opts.Registry == nil {
		return nil
	}
	if err := s.opts.Registry.Claim(ctx, a.Proto()); err != nil {
		s.mu.Lock()
		delete(s.joining, a.ID)
		s.mu.Unlock()
		return err
	}
	return nil
}

// promote makes a welcomed agent routable and, with an AgentTimeout,
// watched by the keeper. It reports whether the gateway began draining
// meanwhile, in which case the agent has not been told to go elsewhere yet.
func (s *Service) promote(a *Agent) (draining bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.joining, a.ID)
	s.agents[a.ID] = a
	s.metrics.Connected(1)
	if s.opts.AgentTimeout > 0 && !s.keeping {
		s.keeping = true
		go s.keep()
	}
	return s.draining
}

// deregister removes a, reserved or routable, and releases its lease. It is
// idempotent.
func (s *Service) deregister(a *Agent) {
	s.mu.Lock()
	mine := s.agents[a.ID] == a || s.joining[a.ID] == a
	if s.agents[a.ID] == a {
		delete(s.agents, a.ID)
		s.metrics.Connected(-1)
	}
	if s.joining[a.ID] == a {
		delete(s.joining, a.ID)
	}
	s.mu.Unlock()
	if mine && s.opts.Registry != nil {
		// The stream is over; its context is not, so that the lease is
		// released now rather than left to expire.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.opts.Registry.Release(ctx, a.ID, a.InstanceID); err != nil {
			s.log.Warn("could not release agent registration; it will expire", "agent_id", a.ID, "error", err)
		}
	}
}

// keep is the replica's one liveness loop: it closes the streams of agents
// silent for AgentTimeout. One loop instead of a timer per agent keeps an
// idle agent cheap; it runs while any agent is registered. (Registrations
// need no renewal per agent: the registry keeps one lease per replica.)
func (s *Service) keep() {
	t := time.NewTicker(min(max(s.opts.AgentTimeout/8, 5*time.Millisecond), time.Second))
	defer t.Stop()
	var agents []*Agent
	for range t.C {
		s.mu.Lock()
		if len(s.agents) == 0 {
			s.keeping = false
			s.mu.Unlock()
			return
		}
		agents = agents[:0]
		for _, a := range s.agents {
			agents = append(agents, a)
		}
		s.mu.Unlock()
		now := s.now()
		for _, a := range agents {
			if now.Sub(a.LastSeen()) >= s.opts.AgentTimeout && !a.evicting.Load() {
				go s.evict(a, errSilent, true)
			}
		}
		clear(agents)
	}
}

// Holdings lists the agents this replica holds or is registering, for the
// registry to register again under a new lease.
func (s *Service) Holdings() []*gatewayv1.Agent {
	s.mu.Lock()
	held := make([]*Agent, 0, len(s.agents)+len(s.joining))
	for _, a := range s.agents {
		held = append(held, a)
	}
	for _, a := range s.joining {
		held = append(held, a)
	}
	s.mu.Unlock()
	out := make([]*gatewayv1.Agent, len(held))
	for i, a := range held {
		out[i] = a.Proto()
	}
	return out
}

// Lost ends the stream of the agent connection whose registration another
// connection took (while this replica's lease had expired), telling the
// agent to reconnect. A connection still registering needs nothing: its
// own claim fails.
func (s *Service) Lost(agentID, instanceID string, reason error) {
	s.mu.Lock()
	a := s.agents[agentID]
	s.mu.Unlock()
	if a != nil && a.InstanceID == instanceID {
		go s.moveOn(a, reason)
	}
}

// moveOn ends the stream of an agent whose registration another connection
// took over (after a partition long enough for the lease to expire), with
// Shutdown first to tell it to reconnect. An agent that does not read gets
// its stream closed anyway, after a moment.
func (s *Service) moveOn(a *Agent, reason error) {
	force := time.AfterFunc(5*time.Second, func() { s.evict(a, reason, false) })
	defer force.Stop()
	_ = a.send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Shutdown{Shutdown: &covenpb.Shutdown{Reason: status.Convert(reason).Message()}}})
	s.evict(a, reason, false)
}

// evict deregisters a, then ends its stream with reason: deregistered
// first, because gRPC ends a stream closed this way at once, and the agent
// may reconnect at once.
func (s *Service) evict(a *Agent, reason error, timeout bool) {
	if !a.evicting.CompareAndSwap(false, true) {
		return
	}
	if timeout {
		s.metrics.Evicted(metrics.Silent)
	} else {
		s.metrics.Evicted(metrics.LeaseLost)
	}
	s.deregister(a)
	a.closeStream(reason, timeout)
}

// Agents returns the agents connected to this replica.
func (s *Service) Agents() []*Agent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Agent, 0, len(s.agents))
	for _, a := range s.agents {
		out = append(out, a)
	}
	return out
}

// Holds reports whether agentID is connected to this replica.
func (s *Service) Holds(agentID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.agents[agentID]
	return ok
}

func (s *Service) shutdownMessage() *covenpb.ServerMessage {
	s.mu.Lock()
	reason := s.shutdownReason
	s.mu.Unlock()
	return &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Shutdown{Shutdown: &covenpb.Shutdown{Reason: reason}}}
}

// Shutdown refuses new registrations and sends Shutdown{reason} to every
// connected agent, so they reconnect through the load balancer to another
// replica. It does not close the streams: agents finish and disconnect, and
// the server's drain deadline bounds the wait.
func (s *Service) Shutdown(ctx context.Context, reason string) {
	s.mu.Lock()
	s.draining = true
	s.shutdownReason = reason
	agents := make([]*Agent, 0, len(s.agents))
	for _, a := range s.agents {
		agents = append(agents, a)
	}
	s.mu.Unlock()
	msg := s.shutdownMessage()
	for _, a := range agents {
		if err := a.send(msg); err != nil {
			s.log.WarnContext(ctx, "could not send Shutdown", "agent_id", a.ID, "error", err)
		}
	}
}
