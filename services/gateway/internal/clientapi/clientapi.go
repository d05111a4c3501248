// Package clientapi serves conclave.gateway.v1.GatewayService: how people and
// programs list the connected agents, send them messages and stream their
// replies, and cancel a request.
package clientapi

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
)

// Agents is what the client API needs of the agent side.
type Agents interface {
	Agents() []*agentstream.Agent
	Send(ctx context.Context, agentID string, msg *covenpb.SendMessage) (*agentstream.Request, error)
	Cancel(ctx context.Context, requestID, reason string) bool
	// Holds reports whether agentID is connected to this replica.
	Holds(agentID string) bool
}

var _ Agents = (*agentstream.Service)(nil)

// Limits bound what a client may send.
type Limits struct {
	// MaxContentBytes bounds SendMessageRequest.content.
	MaxContentBytes int
	// MaxAttachments bounds the number of attachments.
	MaxAttachments int
	// MaxAttachmentBytes bounds the attachments' total size.
	MaxAttachmentBytes int
}

// DefaultLimits keep a request well inside gRPC's 4 MiB message limit.
var DefaultLimits = Limits{MaxContentBytes: 256 << 10, MaxAttachments: 16, MaxAttachmentBytes: 3 << 20}

const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// Server implements gatewayv1.GatewayServiceServer.
type Server struct {
	gatewayv1.UnimplementedGatewayServiceServer
	agents   Agents
	limits   Limits
	serverID string
	cluster  Cluster
	peers    *Peers
	idem     *idempotency // nil: idempotency keys are refused
	log      *slog.Logger
	metrics  *metrics.Metrics

	hist      *history.Store // nil: no history
	detached  time.Duration
	admins    map[string]bool
	recorders sync.WaitGroup
	ends      endContexts
}

var _ gatewayv1.GatewayServiceServer = (*Server)(nil)

// New returns a Server over this replica's agents. With a cluster and peers
// it lists every replica's agents and forwards requests for agents held
// elsewhere to their replica.
func New(agents Agents, limits Limits, serverID string, cluster Cluster, peers *Peers, opts ...Option) *Server {
	s := &Server{agents: agents, limits: limits, serverID: serverID, cluster: cluster, peers: peers,
		log: slog.New(slog.DiscardHandler), metrics: metrics.Discard()}
	for _, o := range opts {
		o(s)
	}
	return s
}

// WithLogger logs what the client cannot be told, such as a key that could
// not be given back.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// WithMetrics counts requests, their outcomes and durations, and forwarding.
func WithMetrics(m *metrics.Metrics) Option { return func(s *Server) { s.metrics = m } }

// local indexes this replica's agents, whose live state (busy, queued) the
// registry does not keep.
func (s *Server) local() map[string]*agentstream.Agent {
	m := map[string]*agentstream.Agent{}
	for _, a := range s.agents.Agents() {
		m[a.ID] = a
	}
	return m
}

func (s *Server) withLocalState(a *gatewayv1.Agent, local map[string]*agentstream.Agent) *gatewayv1.Agent {
	if l, ok := local[a.GetAgentId()]; ok && l.InstanceID == a.GetInstanceId() {
		return l.Proto()
	}
	return a
}

// ListAgents implements gatewayv1.GatewayServiceServer. Agents are ordered by
// ID; the page token is the last ID of the previous page.
func (s *Server) ListAgents(ctx context.Context, req *gatewayv1.ListAgentsRequest) (*gatewayv1.ListAgentsResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, status.Error(codes.InvalidArgument, "page_size must not be negative")
	case size == 0:
		size = defaultPageSize
	case size > maxPageSize:
		size = maxPageSize
	}
	if s.cluster != nil {
		return s.listCluster(ctx, req, size)
	}
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) == 0 {
			return nil, status.Error(codes.InvalidArgument, "page_token is not one this server issued")
		}
		after = string(b)
	}
	agents := s.agents.Agents()
	slices.SortFunc(agents, func(a, b *agentstream.Agent) int { return strings.Compare(a.ID, b.ID) })
	resp := &gatewayv1.ListAgentsResponse{}
	for _, a := range agents {
		if a.ID <= after && after != "" {
			continue
		}
		if c := req.GetCapability(); c != "" && !slices.Contains(a.Capabilities, c) {
			continue
		}
		if len(resp.Agents) == size {
			resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(resp.Agents[size-1].AgentId))
			break
		}
		resp.Agents = append(resp.Agents, a.Proto())
	}
	return resp, nil
}

// listCluster pages through every replica's agents in the registry; the
// page token is the registry's cursor.
func (s *Server) listCluster(ctx context.Context, req *gatewayv1.ListAgentsRequest, size int) (*gatewayv1.ListAgentsResponse, error) {
	local := s.local()
	resp := &gatewayv1.ListAgentsResponse{}
	cursor := req.GetPageToken()
	for {
		agents, next, err := s.cluster.List(ctx, size-len(resp.Agents), cursor)
		if err != nil {
			return nil, err
		}
		for _, a := range agents {
			if c := req.GetCapability(); c == "" || slices.Contains(a.GetCapabilities(), c) {
				resp.Agents = append(resp.Agents, s.withLocalState(a, local))
			}
		}
		if next == "" || len(resp.Agents) == size {
			resp.NextPageToken = next
			return resp, nil
		}
		cursor = next
	}
}

// GetAgent implements gatewayv1.GatewayServiceServer.
func (s *Server) GetAgent(ctx context.Context, req *gatewayv1.GetAgentRequest) (*gatewayv1.GetAgentResponse, error) {
	if err := checkID(ids.AgentID, req.GetAgentId()); err != nil {
		return nil, err
	}
	if s.cluster != nil {
		a, err := s.cluster.Get(ctx, req.GetAgentId())
		if err != nil {
			return nil, err
		}
		return &gatewayv1.GetAgentResponse{Agent: s.withLocalState(a, s.local())}, nil
	}
	for _, a := range s.agents.Agents() {
		if a.ID == req.GetAgentId() {
			return &gatewayv1.GetAgentResponse{Agent: a.Proto()}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "agent %q is not connected", req.GetAgentId())
}

func (s *Server) validate(req *gatewayv1.SendMessageRequest) error {
	if err := checkID(ids.AgentID, req.GetAgentId()); err != nil {
		return err
	}
	if req.GetThreadId() != "" {
		if err := checkID(ids.ThreadID, req.GetThreadId()); err != nil {
			return err
		}
	}
	if n := len(req.GetContent()); n > s.limits.MaxContentBytes {
		return status.Errorf(codes.InvalidArgument, "content is %d bytes; at most %d are allowed", n, s.limits.MaxContentBytes)
	}
	if n := len(req.GetAttachments()); n > s.limits.MaxAttachments {
		return status.Errorf(codes.InvalidArgument, "%d attachments; at most %d are allowed", n, s.limits.MaxAttachments)
	}
	total := 0
	for i, a := range req.GetAttachments() {
		if a.GetFilename() == "" {
			return status.Errorf(codes.InvalidArgument, "attachments[%d].filename is required", i)
		}
		total += len(a.GetData())
	}
	if total > s.limits.MaxAttachmentBytes {
		return status.Errorf(codes.InvalidArgument, "attachments total %d bytes; at most %d are allowed", total, s.limits.MaxAttachmentBytes)
	}
	if key := req.GetIdempotencyKey(); key != "" {
		if err := validateIdempotencyKey(key); err != nil {
			return err
		}
		if s.idem == nil {
			return status.Error(codes.Unimplemented, "this gateway keeps no idempotency records; send without idempotency_key")
		}
	}
	return nil
}

// SendMessage implements gatewayv1.GatewayServiceServer: it streams the
// agent's events until one ends the request. With history, see
// sendRecorded. Without, when the client goes away the agent is told to
// cancel.
//
// A message with an idempotency key is recorded only by the replica that
// holds the agent, just before it is queued, so that a forwarded request is
// recorded once. The record is given back when the agent never received the
// message (it could not be queued, or it ended before it was dispatched),
// so that a retry is sent.
func (s *Server) SendMessage(req *gatewayv1.SendMessageRequest, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	if err := s.validate(req); err != nil {
		s.metrics.Request(metrics.Refused)
		return err
	}
	if s.hist != nil {
		return s.sendRecorded(req, stream)
	}
	ctx, agentID, key := stream.Context(), req.GetAgentId(), req.GetIdempotencyKey()
	msg := &covenpb.SendMessage{
		ThreadId: req.GetThreadId(), Sender: req.GetSender(), Content: req.GetContent(), Attachments: req.GetAttachments(),
	}
	var c *claim
	if key != "" {
		if !s.agents.Holds(agentID) {
			// Never sent from here without a claim: the holder claims it.
			return s.sendElsewhere(req, stream)
		}
		msg.RequestId = agentstream.NewRequestID(s.serverID)
		var err error
		if c, _, err = s.idem.claim(ctx, agentID, key, msg.RequestId, "", ""); err != nil {
			if status.Code(err) == codes.AlreadyExists {
				s.metrics.Request(metrics.IdempotentRepeat)
			} else {
				s.metrics.Request(metrics.Refused)
			}
			return err
		}
	}
	start := time.Now()
	r, err := s.agents.Send(ctx, agentID, msg)
	if err != nil {
		if c != nil {
			s.release(c)
		}
		switch status.Code(err) {
		case codes.NotFound:
			// The agent left between Holds and Send.
			return s.sendElsewhere(req, stream)
		case codes.ResourceExhausted:
			s.metrics.Request(metrics.QueueFull)
		default:
			s.metrics.Request(metrics.Refused)
		}
		return err
	}
	err = s.relay(ctx, start, r, req.GetThreadId(), stream)
	if c != nil && r.Abandon() {
		// The request ended, or its caller left, while it waited: the agent
		// never saw it and, abandoned, never will.
		s.release(c)
	}
	return err
}

// sendElsewhere forwards a request for an agent this replica does not hold
// to the replica that does, or answers NOT_FOUND.
func (s *Server) sendElsewhere(req *gatewayv1.SendMessageRequest, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	if s.cluster != nil && !forwarded(stream.Context()) {
		err := s.forwardSend(req, stream)
		if status.Code(err) == codes.NotFound {
			s.metrics.Request(metrics.NotFound)
		} else {
			s.metrics.Forwarded(err == nil)
		}
		return err
	}
	s.metrics.Request(metrics.NotFound)
	return status.Errorf(codes.NotFound, "agent %q is not connected", req.GetAgentId())
}

// relay streams r's events to the client, after a first response with
// only the request_id, until the request ends or the client goes away. A request abandoned while it waits in the queue gets no
// further event, so the client's context ends the wait. It counts the
// request's outcome and times it from start.
func (s *Server) relay(ctx context.Context, start time.Time, r *agentstream.Request, threadID string, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	// Only a terminal event changes the outcome; a request that ends
	// otherwise, without the agent going away, ended by its caller leaving.
	outcome, first := metrics.CallerLeft, true
	defer func() {
		s.metrics.Request(outcome)
		s.metrics.Finished(time.Since(start))
	}()
	// The first response names the request at once, before the agent
	// says anything: a caller of a silent or busy agent has the
	// request_id to cancel it with, and the stream's headers.
	if err := stream.Send(&gatewayv1.SendMessageResponse{RequestId: r.ID, ThreadId: threadID}); err != nil {
		return fmt.Errorf("streaming to client: %w", err)
	}
	for {
		select {
		case ev, ok := <-r.Events:
			if !ok {
				return ctx.Err()
			}
			if ev.Err != nil {
				outcome = metrics.AgentGone
				return ev.Err
			}
			if first {
				first = false
				s.metrics.FirstEvent(time.Since(start))
			}
			switch ev.Response.GetEvent().(type) {
			case *covenpb.MessageResponse_Done:
				outcome = metrics.Done
			case *covenpb.MessageResponse_Error:
				outcome = metrics.AgentError
			case *covenpb.MessageResponse_Cancelled:
				outcome = metrics.Cancelled
			}
			if err := stream.Send(&gatewayv1.SendMessageResponse{RequestId: r.ID, Event: ev.Response, ThreadId: threadID}); err != nil {
				return fmt.Errorf("streaming to client: %w", err)
			}
			s.metrics.Relayed()
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

func (s *Server) release(c *claim) {
	if err := c.release(); err != nil {
		s.log.Warn("could not give back an idempotency key; retries with it are refused until it expires",
			"agent_id", c.agentID, "request_id", c.requestID, "error", err)
	}
}

// CancelMessage implements gatewayv1.GatewayServiceServer.
func (s *Server) CancelMessage(ctx context.Context, req *gatewayv1.CancelMessageRequest) (*gatewayv1.CancelMessageResponse, error) {
	if err := checkID(ids.RequestID, req.GetRequestId()); err != nil {
		return nil, err
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled by client"
	}
	if owner := requestReplica(req.GetRequestId()); s.cluster != nil && owner != "" && owner != s.serverID && !forwarded(ctx) {
		peer, err := s.peerFor(ctx, owner)
		if err != nil {
			return nil, err
		}
		return peer.CancelMessage(s.peers.outgoing(ctx), &gatewayv1.CancelMessageRequest{RequestId: req.GetRequestId(), Reason: reason})
	}
	return &gatewayv1.CancelMessageResponse{Cancelled: s.agents.Cancel(ctx, req.GetRequestId(), reason)}, nil
}

// checkID applies kind's rule, the one agent registration shares: a
// refused id is INVALID_ARGUMENT naming the field, before any store call.
func checkID(kind ids.Kind, id string) error {
	if err := kind.Check(id); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}
