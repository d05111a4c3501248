package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// testServer is a Server running in the background for one test.
type testServer struct {
	*Server
	logs   *testenv.LockedBuffer
	cancel context.CancelFunc
	done   chan error

	once   sync.Once
	runErr error
}

// startServer builds a server on loopback ports chosen by the kernel, lets
// setup register routes and services, and runs it until the test ends.
func startServer(t *testing.T, cfg Config, setup func(*Server), opts ...Option) *testServer {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	logs := &testenv.LockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(cfg, logger, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if setup != nil {
		setup(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-ts.done:
		cancel()
		t.Fatalf("Run returned before Ready: %v", err)
	}
	t.Cleanup(func() {
		// Tests that care about Run's result call stop themselves; any
		// other failure to drain is still a failure.
		if err := ts.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ts
}

func bothListeners() Config {
	return Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}
}

// stop cancels Run's context and returns Run's result; later calls return
// the same result.
func (ts *testServer) stop() error {
	ts.once.Do(func() {
		ts.cancel()
		ts.runErr = <-ts.done
	})
	return ts.runErr
}

func (ts *testServer) url(path string) string { return "http://" + ts.HTTPAddr() + path }

func (ts *testServer) dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(ts.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

type httpResult struct {
	status int
	body   string
	err    error
}

func get(t *testing.T, url string) httpResult {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return httpResult{err: err}
	}
	return readResponse(resp)
}

func readResponse(resp *http.Response) httpResult {
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return httpResult{status: resp.StatusCode, body: string(b), err: err}
}

// A hand-written gRPC service, so the tests need no generated code: one
// unary and one bidirectional streaming method on wrapperspb.StringValue.
const (
	testServiceName  = "conclave.server.test.Test"
	testUnaryMethod  = "/" + testServiceName + "/Unary"
	testStreamMethod = "/" + testServiceName + "/Stream"
)

type testService struct {
	unary  func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
	stream func(ss grpc.ServerStream) error
}

var testServiceDesc = grpc.ServiceDesc{
	ServiceName: testServiceName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				svc, ok := srv.(*testService)
				if !ok {
					return nil, status.Errorf(codes.Internal, "the service is a %T, want a *testService", srv)
				}
				in, ok := req.(*wrapperspb.StringValue)
				if !ok {
					return nil, status.Errorf(codes.Internal, "the request is a %T, want a *wrapperspb.StringValue", req)
				}
				return svc.unary(ctx, in)
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: testUnaryMethod}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			svc, ok := srv.(*testService)
			if !ok {
				return status.Errorf(codes.Internal, "the service is a %T, want a *testService", srv)
			}
			return svc.stream(ss)
		},
	}},
}

func registerTestService(s *Server, svc *testService) {
	s.GRPC().RegisterService(&testServiceDesc, svc)
}

func callUnary(ctx context.Context, conn *grpc.ClientConn, in string) (string, error) {
	out := new(wrapperspb.StringValue)
	err := conn.Invoke(ctx, testUnaryMethod, wrapperspb.String(in), out)
	return out.GetValue(), err
}

func openStream(ctx context.Context, conn *grpc.ClientConn) (grpc.ClientStream, error) {
	return conn.NewStream(ctx, &testServiceDesc.Streams[0], testStreamMethod)
}

func echo(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	return in, nil
}
