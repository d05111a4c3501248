package covenlink

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// oneMessage is a CovenControl that welcomes the agent, sends it one
// SendMessage, and holds the stream until the test ends.
type oneMessage struct {
	covenpb.UnimplementedCovenControlServer
	msg *covenpb.SendMessage
}

func (s *oneMessage) AgentStream(st grpc.BidiStreamingServer[covenpb.AgentMessage, covenpb.ServerMessage]) error {
	if _, err := st.Recv(); err != nil {
		return err
	}
	if err := st.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Welcome{Welcome: &covenpb.Welcome{ServerId: "test"}}}); err != nil {
		return err
	}
	if err := st.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_SendMessage{SendMessage: s.msg}}); err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// TestSendMessageTraceContext: a SendMessage's trace_context is the
// context the turn is prompted in (the client's trace); without one, or
// with one that is not W3C trace context, the prompt has no span.
func TestSendMessageTraceContext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		carrier   map[string]string
		wantTrace string
	}{
		{"the client's trace", map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"none", nil, ""},
		{"malformed", map[string]string{"traceparent": "not a traceparent"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lis := bufconn.Listen(1 << 20)
			srv := grpc.NewServer()
			covenpb.RegisterCovenControlServer(srv, &oneMessage{msg: &covenpb.SendMessage{RequestId: "r1", Content: "hi", TraceContext: tc.carrier}})
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })

			prompted := make(chan trace.SpanContext, 1)
			l := NewRegistrar(conn, "", 0, slog.New(slog.DiscardHandler)).Open(Agent{ID: "a1",
				Prompt: func(ctx context.Context, message string, accepted func(int)) error {
					prompted <- trace.SpanContextFromContext(ctx)
					return nil
				},
				Cancel: func(string) {}, Note: func(string) {}})
			t.Cleanup(func() { l.Close("the test ended") })
			select {
			case sc := <-prompted:
				got := ""
				if sc.IsValid() {
					got = sc.TraceID().String()
				}
				if got != tc.wantTrace || (sc.IsValid() && !sc.IsRemote()) {
					t.Fatalf("the prompt's trace = %q (remote %v), want %q", got, sc.IsRemote(), tc.wantTrace)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the message was never prompted")
			}
		})
	}
}
