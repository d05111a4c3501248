package service_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/internal/clientapi"
)

// heldBy is the request_id an ALREADY_EXISTS for a repeated idempotency key
// names in its ErrorInfo, after checking its message names it too.
func heldBy(t *testing.T, err error) string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.AlreadyExists {
		t.Fatalf("%v, want ALREADY_EXISTS", err)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == "IDEMPOTENCY_KEY_REUSED" {
			id := info.GetMetadata()["request_id"]
			if id == "" || !strings.HasSuffix(st.Message(), "as request "+id) {
				t.Fatalf("message %q does not name request %q", st.Message(), id)
			}
			return id
		}
	}
	t.Fatalf("ALREADY_EXISTS without ErrorInfo: %v", st.Details())
	return ""
}

// settle sends a message without a key and waits for its reply: once it is
// done, the agent has received everything queued before it.
func settle(t *testing.T, ctx context.Context, client gatewayv1.GatewayServiceClient, agent string) {
	t.Helper()
	if r := send(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: agent, Content: "settle"}); r.err != nil {
		t.Fatalf("settling %s: %v", agent, r.err)
	}
}

// retryAfterBusy lets the holding agent end its "busy" message, then sends
// req again and checks the retry reaches the agent rather than ending
// first; it returns the retry's reply once the agent has ended it too.
func retryAfterBusy(t *testing.T, ctx context.Context, client gatewayv1.GatewayServiceClient, agent *testAgent, busy <-chan reply, req *gatewayv1.SendMessageRequest) reply {
	t.Helper()
	agent.done(t)
	if r := await(t, busy, "busy's reply"); r.err != nil {
		t.Fatalf("busy: %+v", r)
	}
	retry := make(chan reply, 1)
	go func() { retry <- send(as(ctx, token), client, req) }()
	select {
	case r := <-retry:
		t.Fatalf("the retry ended before it reached the agent: %+v", r)
	case <-agent.gotOne:
	case <-time.After(time.Minute):
		t.Fatal("the retry neither reached the agent nor ended within a minute")
	}
	agent.done(t)
	return await(t, retry, "the retry's reply")
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	conn, base := startTuned(t, "gw-idem", st, nil)
	// Not deferred: the parallel subtests run after this function returns.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := gatewayv1.NewGatewayServiceClient(conn)

	t.Run("a repeat is refused and the agent gets the message once", func(t *testing.T) {
		t.Parallel()
		agent := startAgent(t, ctx, conn, "idem-once", false)
		req := &gatewayv1.SendMessageRequest{AgentId: "idem-once", Content: "pay 10", IdempotencyKey: "order-1"}
		first := send(as(ctx, token), client, req)
		if first.err != nil || strings.Join(first.events, "|") != "working: pay 10|done" {
			t.Fatalf("first send: %+v", first)
		}
		for range 2 {
			if id := heldBy(t, send(as(ctx, token), client, req).err); id != first.requestID {
				t.Fatalf("the repeat names request %s, want the first, %s", id, first.requestID)
			}
		}
		// Over REST: 409 with the same message, as a google.rpc.Status.
		httpReq, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/agents/idem-once/messages",
			strings.NewReader(`{"content":"pay 10","idempotency_key":"order-1"}`))
		httpReq.Header.Set("Authorization", "Bearer "+token)
		httpReq.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(httpReq)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Code    codes.Code `json:"code"`
			Message string     `json:"message"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || err != nil || body.Code != codes.AlreadyExists ||
			!strings.Contains(body.Message, first.requestID) {
			t.Fatalf("REST repeat: HTTP %d, %+v (%v); want 409 naming %s", resp.StatusCode, body, err, first.requestID)
		}
		settle(t, ctx, client, "idem-once")
		if got := agent.got(); !slices.Equal(got, []string{"pay 10", "settle"}) {
			t.Fatalf("the agent received %q, want the message once", got)
		}
	})

	t.Run("scopes: another client, another agent", func(t *testing.T) {
		t.Parallel()
		one := startAgent(t, ctx, conn, "idem-scope-1", false)
		two := startAgent(t, ctx, conn, "idem-scope-2", false)
		sends := []struct {
			name, tok, agent string
			want             codes.Code
		}{
			{"first", token, "idem-scope-1", codes.OK},
			{"another client, same agent and key", otherToken, "idem-scope-1", codes.OK},
			{"same client and key, another agent", token, "idem-scope-2", codes.OK},
			{"repeat of the first", token, "idem-scope-1", codes.AlreadyExists},
			{"repeat of the other client's", otherToken, "idem-scope-1", codes.AlreadyExists},
		}
		for _, s := range sends {
			r := send(as(ctx, s.tok), client, &gatewayv1.SendMessageRequest{AgentId: s.agent, Content: s.name, IdempotencyKey: "shared-key"})
			if status.Code(r.err) != s.want {
				t.Fatalf("%s: %v, want %v", s.name, r.err, s.want)
			}
		}
		settle(t, ctx, client, "idem-scope-1")
		settle(t, ctx, client, "idem-scope-2")
		if got := one.got(); !slices.Equal(got, []string{"first", "another client, same agent and key", "settle"}) {
			t.Errorf("agent 1 received %q", got)
		}
		if got := two.got(); !slices.Equal(got, []string{"same client and key, another agent", "settle"}) {
			t.Errorf("agent 2 received %q", got)
		}
	})

	// startBusy starts an agent that holds its messages and keeps it busy
	// with one, so that what is sent next waits in its queue; busy delivers
	// that first message's reply.
	startBusy := func(t *testing.T, id string) (*testAgent, chan reply) {
		t.Helper()
		agent := startAgent(t, ctx, conn, id, true)
		busy := make(chan reply, 1)
		go func() {
			busy <- send(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: id, Content: "busy"})
		}()
		await(t, agent.gotOne, "the agent gets busy")
		return agent, busy
	}

	t.Run("a message cancelled while queued can be sent again", func(t *testing.T) {
		t.Parallel()
		agent, busy := startBusy(t, "idem-queue")

		req := &gatewayv1.SendMessageRequest{AgentId: "idem-queue", Content: "queued", IdempotencyKey: "q-1"}
		queued := make(chan reply, 1)
		go func() { queued <- send(as(ctx, token), client, req) }()
		// Once it waits in the queue, a repeat names it.
		testenv.Eventually(t, time.Minute, "the message is queued", func() bool {
			a, err := client.GetAgent(as(ctx, token), &gatewayv1.GetAgentRequest{AgentId: "idem-queue"})
			return err == nil && a.GetAgent().GetQueuedRequests() == 1
		})
		queuedID := heldBy(t, send(as(ctx, token), client, req).err)

		c, err := client.CancelMessage(as(ctx, token), &gatewayv1.CancelMessageRequest{RequestId: queuedID})
		if err != nil || !c.GetCancelled() {
			t.Fatalf("cancel the queued message: %v %v", c, err)
		}
		if r := await(t, queued, "the cancelled message's reply"); r.err != nil || !slices.Equal(r.events, []string{"cancelled"}) {
			t.Fatalf("the cancelled message's reply: %+v", r)
		}
		// The agent never saw it, so the key was given back before the
		// reply ended: the retry is sent.
		r := retryAfterBusy(t, ctx, client, agent, busy, req) // the cancelled message is skipped
		if r.err != nil || strings.Join(r.events, "|") != "working: queued|done" || r.requestID == queuedID {
			t.Fatalf("the retry: %+v (the cancelled one was %s)", r, queuedID)
		}
		if id := heldBy(t, send(as(ctx, token), client, req).err); id != r.requestID {
			t.Fatalf("after the retry the key names %s, want the retry %s", id, r.requestID)
		}
		if got := agent.got(); !slices.Equal(got, []string{"busy", "queued"}) {
			t.Fatalf("the agent received %q", got)
		}
	})

	t.Run("a message whose caller left while it was queued can be sent again", func(t *testing.T) {
		t.Parallel()
		agent, busy := startBusy(t, "idem-left")

		req := &gatewayv1.SendMessageRequest{AgentId: "idem-left", Content: "abandoned", IdempotencyKey: "left-1"}
		leaving, leave := context.WithCancel(as(ctx, token))
		left := make(chan reply, 1)
		go func() { left <- send(leaving, client, req) }()
		claimed := func() bool {
			page, err := st.Query(ctx, clientapi.IdempotencyTable.Name, store.Query{PK: auth.TokenID(token), Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(page.Items, func(it store.Item) bool { return it.Attrs["agent_id"] == "idem-left" })
		}
		testenv.Eventually(t, time.Minute, "the message is queued", func() bool {
			a, err := client.GetAgent(as(ctx, token), &gatewayv1.GetAgentRequest{AgentId: "idem-left"})
			return err == nil && a.GetAgent().GetQueuedRequests() == 1 && claimed()
		})
		leave()
		if r := await(t, left, "the abandoned call"); status.Code(r.err) != codes.Canceled {
			t.Fatalf("the abandoned call: %+v", r)
		}
		// The gateway gives the key back once it sees the client gone,
		// which the client is not told of.
		testenv.Eventually(t, time.Minute, "the key is given back", func() bool { return !claimed() })

		// The abandoned message is skipped.
		if r := retryAfterBusy(t, ctx, client, agent, busy, req); r.err != nil || strings.Join(r.events, "|") != "working: abandoned|done" {
			t.Fatalf("the retry: %+v", r)
		}
		if got := agent.got(); !slices.Equal(got, []string{"busy", "abandoned"}) {
			t.Fatalf("the agent received %q, want the abandoned message once, from the retry", got)
		}
	})

	t.Run("invalid keys", func(t *testing.T) {
		t.Parallel()
		startAgent(t, ctx, conn, "idem-bad", false)
		tests := []struct {
			name string
			key  string
			want codes.Code
		}{
			{"128 bytes", strings.Repeat("k", 128), codes.OK},
			{"129 bytes", strings.Repeat("k", 129), codes.InvalidArgument},
			{"a newline", "line\nbreak", codes.InvalidArgument},
			{"a tab", "tab\there", codes.InvalidArgument},
		}
		for _, tt := range tests {
			r := send(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "idem-bad", Content: "x", IdempotencyKey: tt.key})
			if status.Code(r.err) != tt.want {
				t.Errorf("%s: %v, want %v", tt.name, r.err, tt.want)
			}
		}
		if r := send(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "idem-nobody", Content: "x", IdempotencyKey: "k"}); status.Code(r.err) != codes.NotFound {
			t.Errorf("a key for an agent not connected: %v, want NOT_FOUND", r.err)
		}
	})
}

// TestIdempotencyAcrossReplicas sends a keyed message for an agent on
// replica A through replica B: A records the key (once), so the repeat is
// refused through either replica.
func TestIdempotencyAcrossReplicas(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	connA, _ := startTuned(t, "gw-idem-a", st, nil)
	connB, _ := startTuned(t, "gw-idem-b", st, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := startAgent(t, ctx, connA, "idem-far", false)
	clientA, clientB := gatewayv1.NewGatewayServiceClient(connA), gatewayv1.NewGatewayServiceClient(connB)

	req := &gatewayv1.SendMessageRequest{AgentId: "idem-far", Content: "once", IdempotencyKey: "far-1"}
	first := send(as(ctx, token), clientB, req)
	if first.err != nil || !strings.HasPrefix(first.requestID, "gw-idem-a.") {
		t.Fatalf("via B: %+v, want a request A assigned", first)
	}
	for _, via := range []struct {
		name   string
		client gatewayv1.GatewayServiceClient
	}{{"A", clientA}, {"B", clientB}} {
		if id := heldBy(t, send(as(ctx, token), via.client, req).err); id != first.requestID {
			t.Fatalf("repeat via %s names %s, want %s", via.name, id, first.requestID)
		}
	}
	// Another client's key is its own, on either replica.
	if r := send(as(ctx, otherToken), clientA, req); r.err != nil {
		t.Fatalf("another client via A: %v", r.err)
	}
	settle(t, ctx, clientA, "idem-far")
	if got := agent.got(); !slices.Equal(got, []string{"once", "once", "settle"}) {
		t.Fatalf("the agent received %q, want the message once per client", got)
	}
}
