package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// grpcServerOptions are the options every Conclave gRPC server starts with;
// caller options are appended after them, so a caller can override a limit.
func (s *Server) grpcServerOptions() []grpc.ServerOption {
	ka := s.cfg.Keepalive
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.cfg.MaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             ka.MinTime,
			PermitWithoutStream: !ka.RejectPingsWithoutStream,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     ka.MaxConnectionIdle,
			MaxConnectionAge:      ka.MaxConnectionAge,
			MaxConnectionAgeGrace: ka.MaxConnectionAgeGrace,
			Time:                  ka.Time,
			Timeout:               ka.Timeout,
		}),
		// Logging is outermost so that it records the codes.Internal that
		// recovery turns a panic into; caller interceptors chain inside both.
		grpc.ChainUnaryInterceptor(s.logUnary, s.recoverUnary),
		grpc.ChainStreamInterceptor(s.logStream, s.recoverStream),
	}
}

func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, s.grpcPanic(ctx, info.FullMethod, v)
		}
	}()
	return handler(ctx, req)
}

func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = s.grpcPanic(ss.Context(), info.FullMethod, v)
		}
	}()
	return handler(srv, ss)
}

// grpcPanic logs a recovered panic with its stack and returns the status the
// client sees. The panic value stays out of the status: it may hold internals.
func (s *Server) grpcPanic(ctx context.Context, method string, v any) error {
	s.logger.ErrorContext(ctx, "panic in gRPC handler", "method", method, "panic", v, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error")
}

func (s *Server) logUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	s.logRPC(ctx, info.FullMethod, start, err)
	return resp, err
}

func (s *Server) logStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	s.logRPC(ss.Context(), info.FullMethod, start, err)
	return err
}

// logRPC logs every call at debug level, at warn level the codes that mean
// the server itself is at fault, so those stand out without enabling debug
// logs in production, and at error level a cause Hide kept from the client.
func (s *Server) logRPC(ctx context.Context, method string, start time.Time, err error) {
	code := status.Code(err)
	level := slog.LevelDebug
	switch code {
	case codes.Unknown, codes.Internal, codes.DataLoss:
		level = slog.LevelWarn
	}
	cause, hidden := HiddenCause(err)
	if hidden {
		// What the client was not told is what the operator must be.
		level = slog.LevelError
	}
	if !s.logger.Enabled(ctx, level) {
		return
	}
	attrs := []any{"method", method, "code", code.String(), "duration", time.Since(start)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if hidden {
		attrs = append(attrs, "cause", cause)
	}
	s.logger.Log(ctx, level, "grpc call", attrs...)
}

// drainingHealth is the standard health service, except that Watch streams
// end once draining closes the listeners. Clients such as gRPC's client-side
// health checking keep a Watch open for the life of the connection, and
// GracefulStop would otherwise wait on them until the drain deadline.
type drainingHealth struct {
	*health.Server
	drained context.Context
}

func (h *drainingHealth) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx, cancel: cancel}
	stop := context.AfterFunc(h.drained, ws.drain)
	defer stop()
	return h.Server.Watch(in, ws)
}

// watchStream ends a Watch only after the watcher has been told the service
// is no longer SERVING. Cancelling as soon as draining starts could race the
// NOT_SERVING update, and the watcher would see the stream end without ever
// learning why.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	serving bool // the last status sent was SERVING
	drained bool
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(resp *healthpb.HealthCheckResponse) error {
	err := w.Health_WatchServer.Send(resp)
	w.mu.Lock()
	w.serving = resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	end := w.drained && !w.serving
	w.mu.Unlock()
	if end {
		w.cancel()
	}
	return err
}

func (w *watchStream) drain() {
	w.mu.Lock()
	w.drained = true
	end := !w.serving
	w.mu.Unlock()
	if end {
		w.cancel()
	}
}

// SelfClient is a client of this server's own gRPC listener, without TLS,
// for a REST front (grpc-gateway) that should pass through the same
// authentication, limits and tracing as gRPC clients. It dials once the
// listener is bound, and is closed on shutdown.
func (s *Server) SelfClient(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+s.cfg.Name+"-self", append(opts,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			select {
			case <-s.Ready():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", s.GRPCAddr())
		}))...)
	if err != nil {
		return nil, fmt.Errorf("%s: client of its own gRPC listener: %w", s.cfg.Name, err)
	}
	s.OnShutdown(func(context.Context) { _ = conn.Close() })
	return conn, nil
}
