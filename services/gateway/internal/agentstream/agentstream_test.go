package agentstream_test

import (
	"context"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
)

// countDropped gives opts metrics of their own, and returns how many
// responses the gateway has dropped so far, as its metrics report.
func countDropped(t *testing.T, opts *agentstream.Options) func() float64 {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	opts.Metrics = metrics.New(tel.Meter("gateway"), "gw-test")
	return func() float64 {
		return metricstest.ScrapeHandler(t, tel.MetricsHandler()).Value("conclave_gateway_responses_dropped_total")
	}
}

func start(t *testing.T, opts agentstream.Options) (*agentstream.Service, covenpb.CovenControlClient) {
	t.Helper()
	if opts.ServerID == "" {
		opts.ServerID = "gw-test"
	}
	svc := agentstream.New(opts, slog.New(slog.DiscardHandler))
	return svc, serve(t, svc, agentstream.ServerOption())
}

// serve runs svc on an in-memory gRPC server built with opts.
func serve(t *testing.T, svc *agentstream.Service, opts ...grpc.ServerOption) covenpb.CovenControlClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
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
	return covenpb.NewCovenControlClient(conn)
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
		{"agent_id with NUL", register("a\x00b"), codes.InvalidArgument},
		{"agent_id with a bidi override", register("a\u202eb"), codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc, c := start(t, agentstream.Options{})
			s := open(t, c)
			if err := s.Send(tt.first); err != nil {
				t.Fatal(err)
			}
			got, msgs := finalStatus(s)
			if got != tt.want {
				t.Fatalf("status = %v, want %v", got, tt.want)
			}
			// An agent_id the rule refuses is told why in coven's own
			// RegistrationError, naming the field.
			if tt.want == codes.InvalidArgument && (len(msgs) != 1 || !strings.Contains(msgs[0].GetRegistrationError().GetReason(), "agent_id")) {
				t.Fatalf("want one RegistrationError naming agent_id before the close, got %v", msgs)
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
	if reason := s.Trailer().Get("conclave-close-reason"); len(reason) != 1 || !strings.Contains(reason[0], "RegisterAgent") {
		t.Fatalf("conclave-close-reason trailer = %q, want the register timeout explained", reason)
	}
}

func TestSilentAgentDeregistered(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{AgentTimeout: 30 * time.Millisecond})
	s := connect(t, c, "quiet")
	if code, _ := finalStatus(s); code != codes.DeadlineExceeded {
		t.Fatalf("status = %v, want DeadlineExceeded", code)
	}
	if reason := s.Trailer().Get("conclave-close-reason"); len(reason) != 1 || !strings.Contains(reason[0], "agent timeout") {
		t.Fatalf("conclave-close-reason trailer = %q, want the silence explained", reason)
	}
	if n := len(svc.Agents()); n != 0 {
		t.Fatalf("silent agent still registered")
	}
}

// Without an AgentTimeout (the default), an agent that sends nothing stays
// registered however long it is silent: coven heartbeats are optional.
func TestSilentAgentKeptWithoutAgentTimeout(t *testing.T) {
	t.Parallel()
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	svc, c := start(t, agentstream.Options{Now: now})
	s := connect(t, c, "quiet")
	skew.Store(int64(24 * time.Hour))
	// A keeper, were one running, would look at least once a second.
	time.Sleep(1500 * time.Millisecond)
	if !svc.Holds("quiet") {
		t.Fatal("a silent agent was deregistered without an agent timeout")
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if code, _ := finalStatus(s); code != codes.OK {
		t.Fatalf("the stream ended with %v, want the agent's own close", code)
	}
}

func TestHeartbeatFloodAndUnknownResponses(t *testing.T) {
	t.Parallel()
	opts := agentstream.Options{MaxHeartbeats: 5}
	dropped := countDropped(t, &opts)
	svc, c := start(t, opts)
	calm := connect(t, c, "calm")
	s := connect(t, c, "busy")
	for range 3 {
		if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{
			RequestId: "someone-else", Event: &covenpb.MessageResponse_Text{Text: "x"},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Sends fail with EOF once the gateway has ended the stream.
	for i := range 1000 {
		if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{TimestampMs: int64(i)}}}); err != nil {
			break
		}
	}
	code, _ := finalStatus(s)
	if code != codes.ResourceExhausted {
		t.Fatalf("heartbeat flood: status = %v, want ResourceExhausted", code)
	}
	if got := dropped(); got != 3 {
		t.Fatalf("dropped = %v, want 3", got)
	}
	// The flood cost only the flooding agent its stream.
	req, err := svc.Send(context.Background(), "calm", &covenpb.SendMessage{Content: "still there?"})
	if err != nil {
		t.Fatal(err)
	}
	respond(t, calm, done(nextRequest(t, calm).GetRequestId()))
	if evs := collect(req); len(evs) != 1 || evs[0].Response.GetDone() == nil {
		t.Fatalf("calm agent's reply = %v", evs)
	}
	// A flooding agent may come back, and heartbeats within the limit are fine.
	again := connect(t, c, "busy")
	for range 3 {
		if err := again.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := again.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if code, _ := finalStatus(again); code != codes.OK {
		t.Fatalf("status after 3 heartbeats = %v, want OK", code)
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	_, c := start(t, agentstream.Options{Authenticate: func(ctx context.Context, agentID string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("authorization"); len(v) != 1 || v[0] != "Bearer "+agentID+"-secret" {
			return status.Errorf(codes.Unauthenticated, "bad token for %s", agentID)
		}
		return nil
	}})
	tests := []struct {
		name, agentID, token string
		want                 codes.Code
	}{
		{"own token", "a1", "Bearer a1-secret", codes.OK},
		{"another agent's token", "a2", "Bearer a1-secret", codes.Unauthenticated},
		{"no token", "a3", "", codes.Unauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tt.token)
			}
			s, err := c.AgentStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(register(tt.agentID)); err != nil {
				t.Fatal(err)
			}
			_ = s.CloseSend()
			code, msgs := finalStatus(s)
			if code != tt.want {
				t.Fatalf("status = %v, want %v", code, tt.want)
			}
			if tt.want != codes.OK && (len(msgs) != 1 || msgs[0].GetRegistrationError() == nil) {
				t.Fatalf("refused agent got %v, want one RegistrationError", msgs)
			}
		})
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

func TestServerWithoutServerOptionSaysSo(t *testing.T) {
	t.Parallel()
	svc := agentstream.New(agentstream.Options{ServerID: "gw-test"}, slog.New(slog.DiscardHandler))
	s := open(t, serve(t, svc))
	_ = s.Send(register("a"))
	if _, err := s.Recv(); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "ServerOption") {
		t.Fatalf("stream on a misconfigured server = %v, want INTERNAL naming ServerOption", err)
	}
}

// gatedRegistry holds every Claim until gate is closed, then answers with
// claimErr.
type gatedRegistry struct {
	gate     chan struct{}
	claiming chan struct{}
	claimErr error
}

func (r *gatedRegistry) Claim(ctx context.Context, _ *gatewayv1.Agent) error {
	r.claiming <- struct{}{}
	<-r.gate
	return r.claimErr
}
func (r *gatedRegistry) Release(context.Context, string, string) error { return nil }

// TestNothingReachesAnAgentBeforeWelcome sends to an agent while its
// cluster-wide claim is pending: it is not routable yet, so the request is
// refused rather than sent ahead of Welcome (or sent to an agent the claim
// then refuses).
func TestNothingReachesAnAgentBeforeWelcome(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		claimErr error
	}{
		{"claim succeeds", nil},
		{"claim refused", status.Error(codes.AlreadyExists, "held elsewhere")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := &gatedRegistry{gate: make(chan struct{}), claiming: make(chan struct{}, 1), claimErr: tt.claimErr}
			svc, c := start(t, agentstream.Options{Registry: reg})
			s := open(t, c)
			if err := s.Send(register("early")); err != nil {
				t.Fatal(err)
			}
			<-reg.claiming
			if _, err := svc.Send(context.Background(), "early", &covenpb.SendMessage{Content: "too soon"}); status.Code(err) != codes.NotFound {
				t.Fatalf("Send while the claim is pending = %v, want NotFound", err)
			}
			if svc.Holds("early") || len(svc.Agents()) != 0 {
				t.Fatal("an agent whose claim is pending is listed")
			}
			// A second registration of the same ID is refused meanwhile.
			dup := open(t, c)
			_ = dup.Send(register("early"))
			if code, _ := finalStatus(dup); code != codes.AlreadyExists {
				t.Fatalf("duplicate while the claim is pending = %v, want AlreadyExists", code)
			}
			close(reg.gate)
			m, err := s.Recv()
			if tt.claimErr != nil {
				if err != nil || m.GetRegistrationError() == nil {
					t.Fatalf("refused agent's first message = %v, %v; want RegistrationError", m, err)
				}
				if code, msgs := finalStatus(s); code != codes.AlreadyExists || len(msgs) != 0 {
					t.Fatalf("refused agent: %v then %v", msgs, code)
				}
				return
			}
			if err != nil || m.GetWelcome() == nil {
				t.Fatalf("first message = %v, %v; want Welcome", m, err)
			}
			req, err := svc.Send(context.Background(), "early", &covenpb.SendMessage{Content: "now"})
			if err != nil {
				t.Fatal(err)
			}
			if got := nextRequest(t, s); got.GetRequestId() != req.ID {
				t.Fatalf("agent got %v, want request %s", got, req.ID)
			}
		})
	}
}
