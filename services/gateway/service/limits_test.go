package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

// otherToken is a second client's token on gateways startTuned runs.
const otherToken = "other-token-0123456789"

// startTuned runs a real gateway replica named id on st, like startReplica,
// with two client tokens (token and otherToken) and cfg adjusted by tune.
func startTuned(t *testing.T, id string, st store.Store, tune func(*service.Config)) (*grpc.ClientConn, string) {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(id)
	// Test agents that hold a message send no heartbeats meanwhile.
	cfg.AgentTimeout = 10 * time.Minute
	cfg.ClientTokens = []string{token, otherToken}
	// Generous unless a test tunes them: these tests are about other
	// things, and parallel subtests share a client's bucket.
	cfg.ClientRate, cfg.ClientBurst, cfg.ClientStreams = 1e6, 1e6, 64
	if tune != nil {
		tune(&cfg)
	}
	return startWith(t, cfg, st, tel)
}

func as(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// testAgent is a coven agent that records what it receives. Each message
// gets a "working: <content>" text event at once; then done, at once or,
// when the agent holds, only once finish is sent a value.
type testAgent struct {
	finish chan struct{}

	mu       sync.Mutex
	received []string // contents, in the order the agent got them
	gotOne   chan struct{}
}

func startAgent(t *testing.T, ctx context.Context, conn *grpc.ClientConn, id string, hold bool) *testAgent {
	t.Helper()
	a := &testAgent{finish: make(chan struct{}), gotOne: make(chan struct{}, 100)}
	stream := registerAgent(t, ctx, conn, id)
	respond := func(r *covenpb.MessageResponse) bool {
		return stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}}) == nil
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
			a.mu.Lock()
			a.received = append(a.received, req.Content)
			a.mu.Unlock()
			a.gotOne <- struct{}{}
			if !respond(&covenpb.MessageResponse{RequestId: req.RequestId, Event: &covenpb.MessageResponse_Text{Text: "working: " + req.Content}}) {
				return
			}
			if hold {
				select {
				case <-a.finish:
				case <-ctx.Done():
					return
				}
			}
			if !respond(&covenpb.MessageResponse{RequestId: req.RequestId, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: req.Content}}}) {
				return
			}
		}
	}()
	return a
}

// done lets a holding agent end the message it works on.
func (a *testAgent) done(t *testing.T) {
	t.Helper()
	select {
	case a.finish <- struct{}{}:
	case <-time.After(time.Minute):
		t.Fatal("the agent is not working on anything to end")
	}
}

// await receives from ch, failing the test rather than hanging when nothing
// comes within a minute.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatalf("%s: nothing within a minute", what)
		panic("unreachable")
	}
}

func (a *testAgent) got() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.received...)
}

// reply is what a SendMessage call returned: its events' texts ("done" for
// done, "cancelled" for cancelled), its request ID and the error that ended
// it (nil for a clean end).
type reply struct {
	events    []string
	requestID string
	err       error
}

func send(ctx context.Context, client gatewayv1.GatewayServiceClient, req *gatewayv1.SendMessageRequest) reply {
	c := sendCall(ctx, client, req, nil)
	r := reply{err: c.err}
	for _, m := range c.responses {
		r.requestID = m.GetRequestId()
		switch ev := m.GetEvent(); {
		case ev == nil:
			// The first response: only the request_id, at once.
		case ev.GetDone() != nil:
			r.events = append(r.events, "done")
		case ev.GetCancelled() != nil:
			r.events = append(r.events, "cancelled")
		default:
			r.events = append(r.events, ev.GetText())
		}
	}
	return r
}

// TestClientRateLimitOverGRPCAndREST spends a client's burst over gRPC and
// REST alike (REST calls pass through the same gRPC interceptors), and
// checks that each token has its own bucket.
func TestClientRateLimitOverGRPCAndREST(t *testing.T) {
	t.Parallel()
	conn, base := startTuned(t, "gw-rate", openStore(t), func(c *service.Config) {
		// A rate this low refills nothing while the test runs: only the
		// burst counts.
		c.ClientRate, c.ClientBurst = 1e-6, 3
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := gatewayv1.NewGatewayServiceClient(conn)

	type result struct {
		code    codes.Code
		message string
	}
	grpcList := func(tok string) result {
		_, err := client.ListAgents(as(ctx, tok), &gatewayv1.ListAgentsRequest{})
		return result{status.Code(err), status.Convert(err).Message()}
	}
	grpcSend := func(tok string) result {
		err := send(as(ctx, tok), client, &gatewayv1.SendMessageRequest{AgentId: "nobody", Content: "x"}).err
		return result{status.Code(err), status.Convert(err).Message()}
	}
	// restGet returns the gRPC code grpc-gateway's JSON error body carries,
	// after checking the HTTP status agrees with it.
	restGet := func(tok string) result {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/agents", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return result{code: codes.OK}
		}
		var body struct {
			Code    codes.Code `json:"code"`
			Message string     `json:"message"`
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("REST error with Content-Type %q, want JSON", ct)
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("REST error body is not JSON: %v", err)
		}
		wantHTTP := map[codes.Code]int{codes.ResourceExhausted: http.StatusTooManyRequests, codes.Unauthenticated: http.StatusUnauthorized}[body.Code]
		if resp.StatusCode != wantHTTP {
			t.Errorf("REST %v answered HTTP %d, want %d", body.Code, resp.StatusCode, wantHTTP)
		}
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Errorf("REST %v: a 429 without Retry-After", body.Code)
		}
		return result{body.Code, body.Message}
	}

	const limitMsg = "client rate limit of 1e-06 requests/s (burst 3) exceeded; retry later"
	steps := []struct {
		name string
		call func(string) result
		tok  string
		want codes.Code
	}{
		{"gRPC call 1", grpcList, token, codes.OK},
		{"REST call 2", restGet, token, codes.OK},
		{"SendMessage call 3 (to no agent)", grpcSend, token, codes.NotFound},
		{"gRPC over the burst", grpcList, token, codes.ResourceExhausted},
		{"SendMessage over the burst", grpcSend, token, codes.ResourceExhausted},
		{"REST over the burst is 429", restGet, token, codes.ResourceExhausted},
		{"a wrong token is refused before any bucket", restGet, "wrong", codes.Unauthenticated},
		{"another token has its own bucket", grpcList, otherToken, codes.OK},
		{"its REST call", restGet, otherToken, codes.OK},
		{"its third", grpcList, otherToken, codes.OK},
		{"and it too runs out", restGet, otherToken, codes.ResourceExhausted},
	}
	// In order: each step spends what the next ones find.
	for _, s := range steps {
		got := s.call(s.tok)
		if got.code != s.want {
			t.Fatalf("%s: %v %q, want %v", s.name, got.code, got.message, s.want)
		}
		if s.want == codes.ResourceExhausted && got.message != limitMsg {
			t.Errorf("%s: message %q, want %q", s.name, got.message, limitMsg)
		}
	}
}

// TestClientRateLimitWithoutTokens: on a gateway without authentication
// every caller is "anonymous", whatever token it sends, so made-up tokens
// neither get fresh buckets nor grow the limiter.
func TestClientRateLimitWithoutTokens(t *testing.T) {
	t.Parallel()
	conn, _ := startTuned(t, "gw-anon", openStore(t), func(c *service.Config) {
		c.ClientTokens, c.AllowUnauthenticated = nil, true
		c.ClientRate, c.ClientBurst = 1e-6, 2
	})
	client := gatewayv1.NewGatewayServiceClient(conn)
	for i, tok := range []string{"", "made-up", "made-up-too"} {
		_, err := client.ListAgents(as(context.Background(), tok), &gatewayv1.ListAgentsRequest{})
		want := codes.OK
		if i == 2 {
			want = codes.ResourceExhausted
		}
		if status.Code(err) != want {
			t.Fatalf("call %d (token %q): %v, want %v", i+1, tok, err, want)
		}
	}
}

// TestClientStreamCap holds SendMessage streams open on agents that do not
// finish, and checks the per-client cap on open streams.
func TestClientStreamCap(t *testing.T) {
	t.Parallel()
	conn, base := startTuned(t, "gw-streams", openStore(t), func(c *service.Config) { c.ClientStreams = 2 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := gatewayv1.NewGatewayServiceClient(conn)
	startAgent(t, ctx, conn, "slow-1", true)
	startAgent(t, ctx, conn, "slow-2", true)
	startAgent(t, ctx, conn, "slow-3", true)
	startAgent(t, ctx, conn, "quick", false)

	// open starts a stream and waits for the agent's first event, so the
	// stream is certainly open on the gateway.
	open := func(tok, agent string) context.CancelFunc {
		t.Helper()
		sctx, scancel := context.WithCancel(as(ctx, tok))
		stream, err := client.SendMessage(sctx, &gatewayv1.SendMessageRequest{AgentId: agent, Content: "hold"})
		if err == nil {
			_, err = stream.Recv()
		}
		if err != nil {
			t.Fatalf("stream to %s: %v", agent, err)
		}
		return scancel
	}
	closeFirst := open(token, "slow-1")
	open(token, "slow-2")

	const capMsg = "client limit of 2 concurrent streams (SendMessage, WatchThread) exceeded; retry later"
	if r := send(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "quick", Content: "third"}); status.Code(r.err) != codes.ResourceExhausted || status.Convert(r.err).Message() != capMsg {
		t.Fatalf("a third stream: %v, want RESOURCE_EXHAUSTED %q", r.err, capMsg)
	}
	// Over REST as well: 429.
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/agents/quick/messages", strings.NewReader(`{"content":"third"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, body := testenv.Do(t, req)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), capMsg) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a third stream over REST: %d %s", resp.StatusCode, body)
	}
	// Unary calls are not streams.
	if _, err := client.ListAgents(as(ctx, token), &gatewayv1.ListAgentsRequest{}); err != nil {
		t.Fatalf("ListAgents at the stream cap: %v", err)
	}
	// Another client has streams of its own.
	open(otherToken, "slow-3")

	// A stream that ends gives its place back; the gateway learns of the
	// client's departure after the client does, hence the retries.
	closeFirst()
	testenv.Eventually(t, time.Minute, "a stream after one ended", func() bool {
		r := send(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "quick", Content: "again"})
		if r.err != nil && status.Code(r.err) != codes.ResourceExhausted {
			t.Fatalf("a stream after one ended: %v", r.err)
		}
		return r.err == nil && strings.Join(r.events, "|") == "working: again|done"
	})
}

func (r reply) String() string {
	return fmt.Sprintf("events %q, request %q, error %v", r.events, r.requestID, r.err)
}

// restGet sends GET url with token through client and returns the status
// and Retry-After.
func restGet(t *testing.T, client *http.Client, url, tok string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// checkAuthThrottle sends wrong tokens from 127.0.0.1 until the gateway
// throttles that address: from then on every request from it that
// presents a token is refused, the right token included (429 with
// Retry-After on REST, RESOURCE_EXHAUSTED with a retry-after trailer on
// gRPC), while another address is served. Three requests are refused so.
func checkAuthThrottle(t *testing.T, conn *grpc.ClientConn, base string) {
	t.Helper()
	const wrong = "wrong-token-0123456789"
	for i := range auth.ThrottleBurst {
		if code, _ := restGet(t, http.DefaultClient, base+"/v1/agents", wrong); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	if code, retry := restGet(t, http.DefaultClient, base+"/v1/agents", wrong); code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("one wrong token too many: %d, Retry-After %q; want 429 with Retry-After", code, retry)
	}
	if code, retry := restGet(t, http.DefaultClient, base+"/v1/agents", token); code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("the right token from the throttled address: %d, Retry-After %q; want 429 with Retry-After", code, retry)
	}
	var trailer metadata.MD
	_, err := gatewayv1.NewGatewayServiceClient(conn).ListAgents(as(context.Background(), token), &gatewayv1.ListAgentsRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || len(trailer.Get("retry-after")) == 0 {
		t.Errorf("gRPC from the throttled address: %v, trailer %v; want RESOURCE_EXHAUSTED with retry-after", err, trailer)
	}
	if code, _ := restGet(t, testenv.ClientFrom(testenv.OtherLoopback), base+"/v1/agents", token); code != http.StatusOK {
		t.Errorf("another address: %d, want 200", code)
	}
}

// steadyThrottle gives the wrong-token throttle the default burst but no
// regrowth within a test: on a loaded machine a second could pass between
// the requests checkAuthThrottle sends and hand an address a token back.
func steadyThrottle(c *service.Config) {
	c.AuthThrottle = auth.ThrottleSetting{Burst: auth.ThrottleBurst, Every: time.Hour}
}

func TestGatewayThrottlesWrongTokens(t *testing.T) {
	t.Parallel()
	conn, base := startTuned(t, "gw-throttle", openStore(t), steadyThrottle)
	checkAuthThrottle(t, conn, base)
}
