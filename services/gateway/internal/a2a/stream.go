package a2a

import (
	"context"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// localStream is a server stream of the client API called in process: each
// message it is sent goes to send, in the caller's goroutine. It sends no
// gRPC metadata.
type localStream[T any] struct {
	ctx  context.Context
	send func(*T) error
}

var _ grpc.ServerStreamingServer[struct{}] = (*localStream[struct{}])(nil)

func (s *localStream[T]) Send(m *T) error              { return s.send(m) }
func (s *localStream[T]) SetHeader(metadata.MD) error  { return nil }
func (s *localStream[T]) SendHeader(metadata.MD) error { return nil }
func (s *localStream[T]) SetTrailer(metadata.MD)       {}
func (s *localStream[T]) Context() context.Context     { return s.ctx }

// RecvMsg is never called: the request is passed in.
func (s *localStream[T]) RecvMsg(any) error { return io.EOF }

func (s *localStream[T]) SendMsg(m any) error {
	t, ok := m.(*T)
	if !ok {
		return status.Errorf(codes.Internal, "cannot stream a %T", m)
	}
	return s.send(t)
}

// ctxStream is a grpc.ServerStream that only carries a context, for the
// interceptors to read the caller from and to replace (authentication adds
// the caller's identity).
type ctxStream struct {
	localStream[struct{}]
}

func newCtxStream(ctx context.Context) *ctxStream {
	return &ctxStream{localStream[struct{}]{ctx: ctx, send: func(*struct{}) error { return nil }}}
}
