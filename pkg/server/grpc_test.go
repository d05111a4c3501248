package server

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestGRPCPanicBecomesInternal(t *testing.T) {
	t.Parallel()
	// A panicking user interceptor must be recovered as well: caller
	// interceptors chain inside the built-in recovery.
	panicky := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if in, ok := req.(*wrapperspb.StringValue); ok && in.GetValue() == "interceptor" {
			panic("interceptor boom")
		}
		return h(ctx, req)
	})
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, func(s *Server) {
		registerTestService(s, &testService{
			unary: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
				if in.GetValue() == "handler" {
					panic("handler boom")
				}
				return in, nil
			},
			stream: func(ss grpc.ServerStream) error {
				var in wrapperspb.StringValue
				if err := ss.RecvMsg(&in); err != nil {
					return err
				}
				if in.GetValue() == "stream" {
					panic("stream boom")
				}
				return ss.SendMsg(&in)
			},
		})
	}, WithGRPCOptions(panicky))
	conn := ts.dial(t)

	callStream := func(ctx context.Context, in string) error {
		cs, err := openStream(ctx, conn)
		if err != nil {
			return err
		}
		if err := cs.SendMsg(wrapperspb.String(in)); err != nil {
			return err
		}
		if err := cs.CloseSend(); err != nil {
			return err
		}
		return cs.RecvMsg(new(wrapperspb.StringValue))
	}

	tests := []struct {
		name      string
		call      func(ctx context.Context) error
		wantPanic string
	}{
		{"unary handler", func(ctx context.Context) error { _, err := callUnary(ctx, conn, "handler"); return err }, "handler boom"},
		{"unary interceptor", func(ctx context.Context) error { _, err := callUnary(ctx, conn, "interceptor"); return err }, "interceptor boom"},
		{"stream handler", func(ctx context.Context) error { return callStream(ctx, "stream") }, "stream boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(t.Context())
			if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "internal error" {
				t.Errorf("call error = %v, want Internal \"internal error\"", err)
			}
			if !strings.Contains(ts.logs.String(), tt.wantPanic) || !strings.Contains(ts.logs.String(), "runtime/debug.Stack") {
				t.Errorf("panic %q not logged with a stack; logs:\n%s", tt.wantPanic, ts.logs)
			}
			// The server survived and keeps serving.
			if out, err := callUnary(t.Context(), conn, "ok"); err != nil || out != "ok" {
				t.Errorf("call after panic = %q, %v; want ok", out, err)
			}
			if err := callStream(t.Context(), "ok"); err != nil {
				t.Errorf("stream after panic: %v", err)
			}
		})
	}
}

func TestGRPCMessageSizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 1024
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0", MaxRecvMsgSize: limit}, func(s *Server) {
		registerTestService(s, &testService{unary: echo})
	})
	conn := ts.dial(t)
	tests := []struct {
		name string
		size int
		want codes.Code
	}{
		{"within limit", limit / 2, codes.OK},
		{"over limit", 2 * limit, codes.ResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := callUnary(t.Context(), conn, strings.Repeat("x", tt.size))
			if got := status.Code(err); got != tt.want {
				t.Errorf("call with %d bytes: code %v (%v), want %v", tt.size, got, err, tt.want)
			}
		})
	}
}

func TestGRPCCallsAreLogged(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, func(s *Server) {
		registerTestService(s, &testService{unary: echo})
	})
	if _, err := callUnary(t.Context(), ts.dial(t), "hi"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ts.logs.String(), "method="+testUnaryMethod) || !strings.Contains(ts.logs.String(), "code=OK") {
		t.Errorf("call not logged; logs:\n%s", ts.logs)
	}
}

// TestSelfClient: a client made before Run reaches the server's own gRPC
// listener once it is bound.
func TestSelfClient(t *testing.T) {
	t.Parallel()
	var self *grpc.ClientConn
	startServer(t, bothListeners(), func(s *Server) {
		var err error
		if self, err = s.SelfClient(); err != nil {
			t.Fatal(err)
		}
		s.SetServingStatus("conclave.Self", true)
	})
	got, err := healthpb.NewHealthClient(self).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "conclave.Self"})
	if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check through the self client = %v, %v", got, err)
	}
}
