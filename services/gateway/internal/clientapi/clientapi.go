// Package clientapi serves conclave.gateway.v1.GatewayService: how people and
// programs list the connected agents, send them messages and stream their
// replies, and cancel a request.
package clientapi

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
)

// Agents is what the client API needs of the agent side.
type Agents interface {
	Agents() []*agentstream.Agent
	Send(ctx context.Context, agentID string, msg *covenpb.SendMessage) (*agentstream.Request, error)
	Cancel(ctx context.Context, requestID, reason string) bool
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
	agents Agents
	limits Limits
}

var _ gatewayv1.GatewayServiceServer = (*Server)(nil)

// New returns a Server over agents.
func New(agents Agents, limits Limits) *Server {
	return &Server{agents: agents, limits: limits}
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

// GetAgent implements gatewayv1.GatewayServiceServer.
func (s *Server) GetAgent(ctx context.Context, req *gatewayv1.GetAgentRequest) (*gatewayv1.GetAgentResponse, error) {
	if req.GetAgentId() == "" {
		return nil, status.Error(codes.InvalidArgument, "agent_id is required")
	}
	for _, a := range s.agents.Agents() {
		if a.ID == req.GetAgentId() {
			return &gatewayv1.GetAgentResponse{Agent: a.Proto()}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "agent %q is not connected", req.GetAgentId())
}

func (s *Server) validate(req *gatewayv1.SendMessageRequest) error {
	if req.GetAgentId() == "" {
		return status.Error(codes.InvalidArgument, "agent_id is required")
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
	return nil
}

// SendMessage implements gatewayv1.GatewayServiceServer: it streams the
// agent's events until one ends the request. When the client goes away the
// agent is told to cancel.
func (s *Server) SendMessage(req *gatewayv1.SendMessageRequest, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	if err := s.validate(req); err != nil {
		return err
	}
	r, err := s.agents.Send(stream.Context(), req.GetAgentId(), &covenpb.SendMessage{
		ThreadId: req.GetThreadId(), Sender: req.GetSender(), Content: req.GetContent(), Attachments: req.GetAttachments(),
	})
	if err != nil {
		return err
	}
	for ev := range r.Events {
		if ev.Err != nil {
			return ev.Err
		}
		if err := stream.Send(&gatewayv1.SendMessageResponse{RequestId: r.ID, Event: ev.Response}); err != nil {
			return fmt.Errorf("streaming to client: %w", err)
		}
	}
	return stream.Context().Err()
}

// CancelMessage implements gatewayv1.GatewayServiceServer.
func (s *Server) CancelMessage(ctx context.Context, req *gatewayv1.CancelMessageRequest) (*gatewayv1.CancelMessageResponse, error) {
	if req.GetRequestId() == "" {
		return nil, status.Error(codes.InvalidArgument, "request_id is required")
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled by client"
	}
	return &gatewayv1.CancelMessageResponse{Cancelled: s.agents.Cancel(ctx, req.GetRequestId(), reason)}, nil
}
