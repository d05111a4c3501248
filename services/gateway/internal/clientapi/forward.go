package clientapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// Cluster is what the client API needs to reach agents held by other
// replicas.
type Cluster interface {
	Get(ctx context.Context, agentID string) (*gatewayv1.Agent, error)
	// Locate is Get plus the holding replica's address.
	Locate(ctx context.Context, agentID string) (*gatewayv1.Agent, string, error)
	List(ctx context.Context, limit int, cursor string) ([]*gatewayv1.Agent, string, error)
	ReplicaAddr(ctx context.Context, serverID string) (string, error)
}

// forwardedHeader marks a request one replica passed to another, so that a
// request is forwarded at most once even while an agent moves.
const forwardedHeader = "x-conclave-forwarded-by"

func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedHeader)) > 0
}

// Peers dials other replicas, keeping one connection per address.
type Peers struct {
	self string
	opts []grpc.DialOption

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPeers returns Peers for replica self; opts carry tracing, so a
// forwarded request stays in its trace.
func NewPeers(self string, opts ...grpc.DialOption) *Peers {
	return &Peers{self: self, opts: append(opts, grpc.WithTransportCredentials(insecure.NewCredentials())), conns: map[string]*grpc.ClientConn{}}
}

func (p *Peers) client(addr string) (gatewayv1.GatewayServiceClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	conn, ok := p.conns[addr]
	if !ok {
		var err error
		if conn, err = grpc.NewClient(addr, p.opts...); err != nil {
			return nil, fmt.Errorf("dialing gateway replica at %s: %w", addr, err)
		}
		p.conns[addr] = conn
	}
	return gatewayv1.NewGatewayServiceClient(conn), nil
}

// Close closes every connection.
func (p *Peers) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.conns {
		_ = c.Close()
		delete(p.conns, addr)
	}
	return nil
}

// outgoing carries the caller's credentials to the peer, which checks them
// against the same tokens, and marks the request as forwarded.
func (p *Peers) outgoing(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.Pairs(forwardedHeader, p.self)
	if auth := md.Get("authorization"); len(auth) > 0 {
		out.Set("authorization", auth...)
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// peerFor finds the replica holding agentID, or NOT_FOUND.
func (s *Server) peerFor(ctx context.Context, serverID string) (gatewayv1.GatewayServiceClient, error) {
	addr, err := s.cluster.ReplicaAddr(ctx, serverID)
	if err != nil {
		return nil, err
	}
	return s.peers.client(addr)
}

// forwardSend relays SendMessage to the replica holding the agent.
func (s *Server) forwardSend(req *gatewayv1.SendMessageRequest, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	ctx := stream.Context()
	a, addr, err := s.cluster.Locate(ctx, req.GetAgentId())
	if err != nil {
		return err
	}
	if a.GetServerId() == s.serverID {
		// The registry still names this replica, but the agent just left.
		return status.Errorf(codes.NotFound, "agent %q is not connected", req.GetAgentId())
	}
	peer, err := s.peers.client(addr)
	if err != nil {
		return err
	}
	up, err := peer.SendMessage(s.peers.outgoing(ctx), req)
	if err != nil {
		return err
	}
	for {
		m, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err // the peer's status, passed through
		}
		if err := stream.Send(m); err != nil {
			return err
		}
	}
}

// requestReplica is the replica that assigned a request ID
// ("<server_id>.<random>").
func requestReplica(requestID string) string {
	i := strings.LastIndexByte(requestID, '.')
	if i <= 0 {
		return ""
	}
	return requestID[:i]
}
