// Package agentstream serves coven.CovenControl/AgentStream: the long-lived
// bidirectional stream each agent holds with the gateway (seed 001).
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// MaxAgentIDLen bounds agent_id: IDs are keys in logs, metrics and the
// registry, and a UUID needs 36 bytes.
const MaxAgentIDLen = 128

// Options tune the stream's timing.
type Options struct {
	// ServerID names this gateway replica in Welcome.
	ServerID string
	// RegisterTimeout is how long a new stream may stay silent before its
	// RegisterAgent arrives.
	RegisterTimeout time.Duration
	// AgentTimeout is how long a registered agent may stay silent (no
	// heartbeat, no response) before it is deregistered and its stream closed.
	AgentTimeout time.Duration
	// QueueDepth is how many requests may wait for a busy agent.
	QueueDepth int
	// CancelGrace is how long an agent may take to end a request its caller
	// abandoned before the next request is sent anyway.
	CancelGrace time.Duration
	// Registry, when set, makes registrations cluster-wide leases.
	Registry Registry
	// Lease is how long a registration outlives its last renewal; it is
	// renewed every third of it while the stream lives, so a crashed
	// replica's agents are free again within one Lease.
	Lease time.Duration
}

// Registry records which connection holds each agent across replicas.
type Registry interface {
	// Claim fails with ALREADY_EXISTS while another connection holds a.
	Claim(ctx context.Context, a *gatewayv1.Agent, lease time.Duration) error
	// Renew fails with ABORTED once the lease was lost.
	Renew(ctx context.Context, a *gatewayv1.Agent, lease time.Duration) error
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
	send     func(*covenpb.ServerMessage) error
	cancel   context.CancelCauseFunc

	queue    chan *request
	mu       sync.Mutex
	inflight *request
}

// Busy reports whether a request is in flight, and how many wait.
func (a *Agent) Busy() (inflight bool, queued int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inflight != nil, len(a.queue)
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

// LastSeen is when the agent last sent anything.
func (a *Agent) LastSeen() time.Time { return time.Unix(0, a.lastSeen.Load()) }

func (a *Agent) touch(now time.Time) { a.lastSeen.Store(now.UnixNano()) }

// Service implements covenpb.CovenControlServer.
type Service struct {
	covenpb.UnimplementedCovenControlServer

	opts Options
	log  *slog.Logger
	now  func() time.Time

	mu       sync.Mutex
	agents   map[string]*Agent
	requests map[string]requestRef
	draining bool
	nextID   atomic.Uint64

	// droppedResponses counts MessageResponses for requests this replica does
	// not know; they are never delivered elsewhere.
	droppedResponses atomic.Uint64
}

var _ covenpb.CovenControlServer = (*Service)(nil)

// New returns a Service. Zero timeouts take defaults.
func New(opts Options, logger *slog.Logger) *Service {
	if opts.RegisterTimeout <= 0 {
		opts.RegisterTimeout = 10 * time.Second
	}
	if opts.AgentTimeout <= 0 {
		opts.AgentTimeout = 90 * time.Second
	}
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = 32
	}
	if opts.CancelGrace <= 0 {
		opts.CancelGrace = 30 * time.Second
	}
	if opts.Lease <= 0 {
		opts.Lease = 15 * time.Second
	}
	return &Service{opts: opts, log: logger, now: time.Now, agents: map[string]*Agent{}, requests: map[string]requestRef{}}
}

var (
	errNotRegisterFirst = status.Error(codes.FailedPrecondition, "the first message on AgentStream must be RegisterAgent")
	errDraining         = status.Error(codes.Unavailable, "gateway is shutting down; reconnect to another replica")
	errSilent           = status.Error(codes.DeadlineExceeded, "agent sent nothing within the agent timeout; deregistered")
)

// AgentStream runs one agent's connection.
func (s *Service) AgentStream(stream grpc.BidiStreamingServer[covenpb.AgentMessage, covenpb.ServerMessage]) error {
	// Seed 001: headers go out as soon as the stream opens, before the agent
	// speaks, so clients that wait for them do not deadlock.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)

	first, err := s.recvFirst(ctx, stream)
	if err != nil {
		return err
	}
	reg := first.GetRegister()
	if reg == nil {
		return errNotRegisterFirst
	}
	if err := validateAgentID(reg.GetAgentId()); err != nil {
		return err
	}

	// Sends happen from this goroutine's callers and from Shutdown; gRPC
	// streams allow one concurrent sender.
	var sendMu sync.Mutex
	send := func(m *covenpb.ServerMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	agent := &Agent{
		ID:               reg.GetAgentId(),
		Name:             reg.GetName(),
		Capabilities:     reg.GetCapabilities(),
		Metadata:         reg.GetMetadata(),
		ProtocolFeatures: reg.GetProtocolFeatures(),
		InstanceID:       fmt.Sprintf("%s-%d", s.opts.ServerID, s.nextID.Add(1)),
		ServerID:         s.opts.ServerID,
		ConnectedAt:      s.now(),
		send:             send,
		cancel:           cancel,
		queue:            make(chan *request, s.opts.QueueDepth),
	}
	agent.touch(s.now())
	if err := s.register(ctx, agent); err != nil {
		_ = send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_RegistrationError{
			RegistrationError: &covenpb.RegistrationError{Reason: status.Convert(err).Message()},
		}})
		return err
	}
	log := s.log.With("agent_id", agent.ID, "instance_id", agent.InstanceID)
	log.InfoContext(ctx, "agent registered", "name", agent.Name, "capabilities", agent.Capabilities)

	if err := send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Welcome{Welcome: &covenpb.Welcome{
		ServerId: s.opts.ServerID, AgentId: agent.ID, InstanceId: agent.InstanceID,
	}}}); err != nil {
		return err
	}

	go s.watchLiveness(ctx, agent)
	if s.opts.Registry != nil {
		go s.renewLease(ctx, log, agent)
	}
	dispatched, stopDispatch := make(chan struct{}), make(chan struct{})
	go func() { defer close(dispatched); s.dispatch(ctx, stopDispatch, agent) }()
	// Deregistered first, so no new request can be queued; then the
	// dispatcher fails the pending ones before the stream ends, so no caller
	// is left waiting and the agent can reconnect at once.
	defer func() { s.deregister(agent); close(stopDispatch); cancel(nil); <-dispatched }()

	msgs := make(chan *covenpb.AgentMessage)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			cause := context.Cause(ctx)
			if _, ok := status.FromError(cause); ok {
				log.InfoContext(ctx, "agent stream closed by gateway", "reason", cause)
				return cause
			}
			return status.FromContextError(ctx.Err()).Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				log.InfoContext(ctx, "agent disconnected")
				return nil
			}
			return err
		case m := <-msgs:
			agent.touch(s.now())
			s.handle(ctx, log, agent, m)
		}
	}
}

// recvFirst waits for the first message, bounded by RegisterTimeout so that a
// stream left open and silent does not hold a slot forever.
func (s *Service) recvFirst(ctx context.Context, stream grpc.BidiStreamingServer[covenpb.AgentMessage, covenpb.ServerMessage]) (*covenpb.AgentMessage, error) {
	type result struct {
		m   *covenpb.AgentMessage
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := stream.Recv()
		ch <- result{m, err}
	}()
	timer := time.NewTimer(s.opts.RegisterTimeout)
	defer timer.Stop()
	select {
	case r := <-ch:
		if errors.Is(r.err, io.EOF) {
			return nil, status.Error(codes.FailedPrecondition, "stream closed before RegisterAgent")
		}
		return r.m, r.err
	case <-timer.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no RegisterAgent within %s", s.opts.RegisterTimeout)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *Service) handle(ctx context.Context, log *slog.Logger, a *Agent, m *covenpb.AgentMessage) {
	switch p := m.GetPayload().(type) {
	case *covenpb.AgentMessage_Heartbeat:
		// Liveness was renewed by the receipt itself.
	case *covenpb.AgentMessage_Response:
		if !a.route(p.Response) {
			// Never delivered elsewhere: it may be someone else's.
			s.droppedResponses.Add(1)
			log.WarnContext(ctx, "dropped response for a request not in flight", "request_id", p.Response.GetRequestId())
		}
	case *covenpb.AgentMessage_Register:
		log.WarnContext(ctx, "ignored repeated RegisterAgent")
	default:
		log.WarnContext(ctx, "ignored empty AgentMessage")
	}
}

func (s *Service) watchLiveness(ctx context.Context, a *Agent) {
	for {
		wait := time.Until(a.LastSeen().Add(s.opts.AgentTimeout))
		if wait <= 0 {
			a.cancel(errSilent)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func validateAgentID(id string) error {
	switch {
	case id == "":
		return status.Error(codes.InvalidArgument, "RegisterAgent.agent_id is required")
	case len(id) > MaxAgentIDLen:
		return status.Errorf(codes.InvalidArgument, "RegisterAgent.agent_id is %d bytes; at most %d are allowed", len(id), MaxAgentIDLen)
	case strings.ContainsFunc(id, func(r rune) bool { return r < 0x21 || r == 0x7f }):
		// proto3 already guarantees UTF-8; control characters and spaces
		// would still corrupt log lines and registry keys.
		return status.Error(codes.InvalidArgument, "RegisterAgent.agent_id must not contain spaces or control characters")
	}
	return nil
}

// register claims the agent locally, then cluster-wide.
func (s *Service) register(ctx context.Context, a *Agent) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return errDraining
	}
	if _, dup := s.agents[a.ID]; dup {
		s.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "agent %q is already connected", a.ID)
	}
	s.agents[a.ID] = a
	s.mu.Unlock()
	if s.opts.Registry == nil {
		return nil
	}
	if err := s.opts.Registry.Claim(ctx, a.Proto(), s.opts.Lease); err != nil {
		s.mu.Lock()
		delete(s.agents, a.ID)
		s.mu.Unlock()
		return err
	}
	return nil
}

func (s *Service) deregister(a *Agent) {
	s.mu.Lock()
	mine := s.agents[a.ID] == a
	if mine {
		delete(s.agents, a.ID)
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

// renewLease keeps the agent's registration alive while its stream lives,
// and ends the stream if another connection took it over.
func (s *Service) renewLease(ctx context.Context, log *slog.Logger, a *Agent) {
	t := time.NewTicker(s.opts.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := s.opts.Registry.Renew(ctx, a.Proto(), s.opts.Lease)
		switch {
		case err == nil:
		case status.Code(err) == codes.Aborted:
			a.cancel(err)
			return
		default:
			log.WarnContext(ctx, "could not renew agent registration; retrying", "error", err)
		}
	}
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

// DroppedResponses counts responses for unknown requests.
func (s *Service) DroppedResponses() uint64 { return s.droppedResponses.Load() }

// Shutdown refuses new registrations and sends Shutdown{reason} to every
// connected agent, so they reconnect through the load balancer to another
// replica. It does not close the streams: agents finish and disconnect, and
// the server's drain deadline bounds the wait.
func (s *Service) Shutdown(ctx context.Context, reason string) {
	s.mu.Lock()
	s.draining = true
	agents := make([]*Agent, 0, len(s.agents))
	for _, a := range s.agents {
		agents = append(agents, a)
	}
	s.mu.Unlock()
	msg := &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Shutdown{Shutdown: &covenpb.Shutdown{Reason: reason}}}
	for _, a := range agents {
		if err := a.send(msg); err != nil {
			s.log.WarnContext(ctx, "could not send Shutdown", "agent_id", a.ID, "error", err)
		}
	}
}
