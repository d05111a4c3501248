package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

const token = "test-token-0123456789"

// startGateway runs a real gateway on loopback ports, on its own store, and
// returns its gRPC connection and HTTP base URL.
func startGateway(t testing.TB) (*grpc.ClientConn, string) {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	return startReplica(t, "gw-test", openStore(t), tel)
}

func openStore(t testing.TB) store.Store {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := store.EnsureTables(context.Background(), st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	return st
}

// testConfig is the replicas' configuration in these tests: without
// history, with every limit at its default but a short queue.
func testConfig(id string) service.Config {
	return service.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ServerID: id,
		RegisterTimeout: 10 * time.Second, AgentTimeout: time.Minute, ShutdownTimeout: 5 * time.Second,
		QueueDepth: 4, CancelGrace: 5 * time.Second, Lease: 15 * time.Second,
		ClientTokens: []string{token}, AllowAgentsWithoutTokens: true,
		KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second, MaxHeartbeats: 50,
		ClientRate: 50, ClientBurst: 100, ClientStreams: 64,
		IdempotencyTTL: 24 * time.Hour, HistoryFlush: time.Second, DetachedTimeout: 10 * time.Minute,
	}
}

// startReplica runs one gateway replica named id over a store it may share
// with other replicas.
func startReplica(t testing.TB, id string, st store.Store, tel *telemetry.Provider) (*grpc.ClientConn, string) {
	t.Helper()
	return startWith(t, testConfig(id), st, tel)
}

// startWith runs a gateway configured as cfg and returns its gRPC
// connection and HTTP base URL.
func startWith(t testing.TB, cfg service.Config, st store.Store, tel *telemetry.Provider) (*grpc.ClientConn, string) {
	t.Helper()
	gw, err := service.New(cfg, service.Deps{Store: st, Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway run: %v", err)
		}
	})
	<-gw.Ready()
	var grpcAddr, httpAddr string
	for _, e := range gw.Endpoints() {
		if strings.HasPrefix(e.Protocol, "gRPC") {
			grpcAddr = e.Address
		} else {
			httpAddr = e.Address
		}
	}
	conn, err := grpc.NewClient(grpcAddr, append(tel.GRPCDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, "http://" + httpAddr
}

// registerAgent opens an AgentStream for id and waits for its Welcome.
func registerAgent(t *testing.T, ctx context.Context, conn *grpc.ClientConn, id string) grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage] {
	t.Helper()
	stream, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: id, Name: id, Capabilities: []string{"chat"},
	}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("register %s: %v %v", id, m, err)
	}
	return stream
}

// echoAgent registers id and answers every message with its content as text
// followed by done, until ctx ends.
func echoAgent(t *testing.T, ctx context.Context, conn *grpc.ClientConn, id string) {
	t.Helper()
	echoAgentBeating(t, ctx, conn, id, 0)
}

// echoAgentBeating is echoAgent that also sends a heartbeat every beat
// (when positive): on a replica with an agent timeout, an echo agent that
// answers only when asked is evicted as silent whenever the test takes
// longer than that timeout between two requests.
func echoAgentBeating(t *testing.T, ctx context.Context, conn *grpc.ClientConn, id string, beat time.Duration) {
	t.Helper()
	stream := registerAgent(t, ctx, conn, id)
	var sending sync.Mutex // a gRPC stream takes one Send at a time
	send := func(m *covenpb.AgentMessage) error {
		sending.Lock()
		defer sending.Unlock()
		return stream.Send(m)
	}
	if beat > 0 {
		go func() {
			tick := time.NewTicker(beat)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}}) != nil {
					return
				}
			}
		}()
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			req := m.GetSendMessage()
			if req == nil {
				continue
			}
			for _, r := range []*covenpb.MessageResponse{
				{RequestId: req.RequestId, Event: &covenpb.MessageResponse_Text{Text: "echo: " + req.Content}},
				{RequestId: req.RequestId, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: req.Content}}},
			} {
				if send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}}) != nil {
					return
				}
			}
		}
	}()
}

// readReply sends req and reads the reply to its end: the text events, then
// "done:<full_response>", and the request ID.
func readReply(t *testing.T, ctx context.Context, client gatewayv1.GatewayServiceClient, req *gatewayv1.SendMessageRequest) ([]string, string) {
	t.Helper()
	stream, err := client.SendMessage(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var requestID string
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			return got, requestID
		}
		if err != nil {
			t.Fatalf("reply stream: %v", err)
		}
		requestID = m.GetRequestId()
		switch {
		case m.GetEvent().GetText() != "":
			got = append(got, m.GetEvent().GetText())
		case m.GetEvent().GetDone() != nil:
			got = append(got, "done:"+m.GetEvent().GetDone().GetFullResponse())
		}
	}
}

func authed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func TestClientAPIOverGRPC(t *testing.T) {
	t.Parallel()
	conn, _ := startGateway(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoAgent(t, ctx, conn, "echo-1")
	client := gatewayv1.NewGatewayServiceClient(conn)

	if _, err := client.ListAgents(ctx, &gatewayv1.ListAgentsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v", err)
	}
	list, err := client.ListAgents(authed(ctx), &gatewayv1.ListAgentsRequest{Capability: "chat"})
	if err != nil || len(list.Agents) != 1 || list.Agents[0].AgentId != "echo-1" || list.Agents[0].ServerId != "gw-test" {
		t.Fatalf("list: %v %v", list, err)
	}
	if list, _ := client.ListAgents(authed(ctx), &gatewayv1.ListAgentsRequest{Capability: "code"}); len(list.GetAgents()) != 0 {
		t.Fatalf("capability filter let %v through", list.GetAgents())
	}
	if _, err := client.GetAgent(authed(ctx), &gatewayv1.GetAgentRequest{AgentId: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown agent: %v", err)
	}

	got, requestID := readReply(t, authed(ctx), client, &gatewayv1.SendMessageRequest{AgentId: "echo-1", Content: "hello"})
	if strings.Join(got, "|") != "echo: hello|done:hello" || !strings.HasPrefix(requestID, "gw-test.") {
		t.Fatalf("stream = %v (request %s)", got, requestID)
	}

	bad := []struct {
		name string
		req  *gatewayv1.SendMessageRequest
		want codes.Code
	}{
		{"no agent", &gatewayv1.SendMessageRequest{Content: "x"}, codes.InvalidArgument},
		{"unknown agent", &gatewayv1.SendMessageRequest{AgentId: "ghost", Content: "x"}, codes.NotFound},
		{"content too big", &gatewayv1.SendMessageRequest{AgentId: "echo-1", Content: strings.Repeat("x", 300<<10)}, codes.InvalidArgument},
		{"attachment without name", &gatewayv1.SendMessageRequest{AgentId: "echo-1", Attachments: []*covenpb.FileAttachment{{Data: []byte("x")}}}, codes.InvalidArgument},
	}
	for _, b := range bad {
		s, err := client.SendMessage(authed(ctx), b.req)
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != b.want {
			t.Errorf("%s: %v, want %v", b.name, err, b.want)
		}
	}
}

func TestClientAPIOverRESTAndSSE(t *testing.T) {
	t.Parallel()
	conn, base := startGateway(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoAgent(t, ctx, conn, "echo-2")

	do := func(method, path, body, accept string, withToken bool) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		if withToken {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := do("GET", "/v1/agents", "", "", false)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("REST without token: %d", resp.StatusCode)
	}
	resp = do("GET", "/v1/agents?capability=chat", "", "", true)
	var list struct {
		Agents []map[string]any `json:"agents"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Agents) != 1 || list.Agents[0]["agent_id"] != "echo-2" {
		t.Fatalf("REST list (snake_case expected): %v", list)
	}
	resp = do("GET", "/v1/agents/echo-2", "", "", true)
	var one map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&one)
	resp.Body.Close()
	if one["agent_id"] != "echo-2" {
		t.Fatalf("REST get agent: %v", one)
	}

	// Server-Sent Events.
	resp = do("POST", "/v1/agents/echo-2/messages", `{"content":"sse","thread_id":"t1"}`, "text/event-stream", true)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("SSE: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, ev)
		}
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(d, `"text"`) && !strings.Contains(d, "echo: sse") {
			t.Errorf("unexpected data %s", d)
		}
	}
	resp.Body.Close()
	if strings.Join(events, ",") != "message,message,message,end" {
		t.Fatalf("SSE events = %v", events)
	}
	resp = do("POST", "/v1/agents/ghost/messages", `{"content":"x"}`, "text/event-stream", true)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("SSE to an unknown agent: %d", resp.StatusCode)
	}

	// grpc-gateway's own streaming form: one JSON object per line.
	resp = do("POST", "/v1/agents/echo-2/messages", `{"content":"nd"}`, "application/json", true)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"echo: nd"`) || !strings.Contains(string(b), `"request_id"`) {
		t.Fatalf("REST stream: %d %s", resp.StatusCode, b)
	}
	resp = do("POST", "/v1/agents/echo-2/messages", `{"content": 5}`, "application/json", true)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("malformed body: %d", resp.StatusCode)
	}
}
