package agentstream_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
)

func start(t *testing.T, opts agentstream.Options) (*agentstream.Service, covenpb.CovenControlClient) {
	t.Helper()
	if opts.ServerID == "" {
		opts.ServerID = "gw-test"
	}
	svc := agentstream.New(opts, slog.New(slog.DiscardHandler))
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	covenpb.RegisterCovenControlServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return svc, covenpb.NewCovenControlClient(conn)
}

func register(id string) *covenpb.AgentMessage {
	return &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: id, Name: "n-" + id, Capabilities: []string{"chat"}, ProtocolFeatures: []string{"cancellation"},
	}}}
}

func open(t *testing.T, c covenpb.CovenControlClient) grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.AgentStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// connect registers id and returns the stream after Welcome.
func connect(t *testing.T, c covenpb.CovenControlClient, id string) grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage] {
	t.Helper()
	s := open(t, c)
	if err := s.Send(register(id)); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
	if m.GetWelcome().GetAgentId() != id {
		t.Fatalf("want Welcome for %s, got %v", id, m)
	}
	return s
}

// finalStatus reads until the stream ends and returns its status code.
func finalStatus(s grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage]) (codes.Code, []*covenpb.ServerMessage) {
	var got []*covenpb.ServerMessage
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return codes.OK, got
		}
		if err != nil {
			return status.Code(err), got
		}
		got = append(got, m)
	}
}

func TestHeadersBeforeRegistration(t *testing.T) {
	t.Parallel()
	_, c := start(t, agentstream.Options{})
	s := open(t, c)
	// Header blocks until the server sends headers; the agent has said nothing.
	if _, err := s.Header(); err != nil {
		t.Fatalf("headers: %v", err)
	}
}

func TestWelcome(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{ServerID: "gw-7"})
	s := open(t, c)
	if err := s.Send(register("agent-1")); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	w := m.GetWelcome()
	if w.GetServerId() != "gw-7" || w.GetAgentId() != "agent-1" || !strings.HasPrefix(w.GetInstanceId(), "gw-7-") {
		t.Fatalf("welcome = %v", w)
	}
	agents := svc.Agents()
	if len(agents) != 1 || agents[0].ID != "agent-1" || agents[0].ProtocolFeatures[0] != "cancellation" {
		t.Fatalf("registry = %+v", agents)
	}
}

func TestRegistrationRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		first *covenpb.AgentMessage
		want  codes.Code
	}{
		{"heartbeat first", &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}}, codes.FailedPrecondition},
		{"response first", &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{RequestId: "x"}}}, codes.FailedPrecondition},
		{"empty message first", &covenpb.AgentMessage{}, codes.FailedPrecondition},
		{"missing agent_id", register(""), codes.InvalidArgument},
		{"over-long agent_id", register(strings.Repeat("a", agentstream.MaxAgentIDLen+1)), codes.InvalidArgument},
		{"agent_id with space", register("a b"), codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc, c := start(t, agentstream.Options{})
			s := open(t, c)
			if err := s.Send(tt.first); err != nil {
				t.Fatal(err)
			}
			if got, _ := finalStatus(s); got != tt.want {
				t.Fatalf("status = %v, want %v", got, tt.want)
			}
			if n := len(svc.Agents()); n != 0 {
				t.Fatalf("%d agents registered after a rejected registration", n)
			}
		})
	}
}

func TestDuplicateRefusedThenReconnect(t *testing.T) {
	t.Parallel()
	_, c := start(t, agentstream.Options{})
	first := connect(t, c, "dup")

	second := open(t, c)
	if err := second.Send(register("dup")); err != nil {
		t.Fatal(err)
	}
	code, msgs := finalStatus(second)
	if code != codes.AlreadyExists {
		t.Fatalf("duplicate status = %v, want AlreadyExists", code)
	}
	if len(msgs) != 1 || msgs[0].GetRegistrationError().GetReason() == "" {
		t.Fatalf("want one RegistrationError before the close, got %v", msgs)
	}

	// The first agent disconnects; once its stream has ended it can come
	// back under the same ID at once.
	if err := first.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if code, _ := finalStatus(first); code != codes.OK {
		t.Fatalf("clean disconnect ended with %v", code)
	}
	connect(t, c, "dup")
}

func TestSilentStreamBeforeRegistration(t *testing.T) {
	t.Parallel()
	_, c := start(t, agentstream.Options{RegisterTimeout: 20 * time.Millisecond})
	s := open(t, c)
	if code, _ := finalStatus(s); code != codes.DeadlineExceeded {
		t.Fatalf("status = %v, want DeadlineExceeded", code)
	}
}

func TestSilentAgentDeregistered(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{AgentTimeout: 30 * time.Millisecond})
	s := connect(t, c, "quiet")
	if code, _ := finalStatus(s); code != codes.DeadlineExceeded {
		t.Fatalf("status = %v, want DeadlineExceeded", code)
	}
	if n := len(svc.Agents()); n != 0 {
		t.Fatalf("silent agent still registered")
	}
}

func TestHeartbeatFloodAndUnknownResponses(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	s := connect(t, c, "busy")
	for i := range 1000 {
		if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{TimestampMs: int64(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{
			RequestId: "someone-else", Event: &covenpb.MessageResponse_Text{Text: "x"},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if code, _ := finalStatus(s); code != codes.OK {
		t.Fatalf("status = %v", code)
	}
	if got := svc.DroppedResponses(); got != 3 {
		t.Fatalf("dropped = %d, want 3", got)
	}
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	a := connect(t, c, "a")
	b := connect(t, c, "b")
	svc.Shutdown(context.Background(), "maintenance")
	for _, s := range []grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage]{a, b} {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetShutdown().GetReason() != "maintenance" {
			t.Fatalf("want Shutdown, got %v", m)
		}
	}
	late := open(t, c)
	if err := late.Send(register("late")); err != nil {
		t.Fatal(err)
	}
	if code, _ := finalStatus(late); code != codes.Unavailable {
		t.Fatalf("registration while draining = %v, want Unavailable", code)
	}
}
