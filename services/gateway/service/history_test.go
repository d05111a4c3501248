package service_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

const adminToken = "admin-token-0123456789"

// withHistory turns history on, as a deployment's defaults do, with an
// admin token.
func withHistory(tune func(*service.Config)) func(*service.Config) {
	return func(c *service.Config) {
		c.History, c.HistoryTTL, c.HistoryFlush, c.DetachedTimeout = true, 24*time.Hour, 50*time.Millisecond, time.Minute
		c.AdminTokens = []string{adminToken}
		if tune != nil {
			tune(c)
		}
	}
}

// eachHistoryStore runs fn on the embedded store and on DynamoDB
// (dynalite), each with the gateway's tables.
func eachHistoryStore(t *testing.T, fn func(t *testing.T, st store.Store)) {
	t.Helper()
	t.Parallel()
	for name, st := range testenv.Stores(t, dynalite, service.Tables...) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, st)
		})
	}
}

// call is every response of one SendMessage, and how it ended.
type call struct {
	responses []*gatewayv1.SendMessageResponse
	err       error
}

func (c call) first() *gatewayv1.SendMessageResponse {
	if len(c.responses) == 0 {
		return &gatewayv1.SendMessageResponse{}
	}
	return c.responses[0]
}

// events is the call's events as the send helper writes them.
func (c call) events() string {
	var out []string
	for _, m := range c.responses {
		switch ev := m.GetEvent(); {
		case ev == nil:
		case ev.GetDone() != nil:
			out = append(out, "done")
		case ev.GetCancelled() != nil:
			out = append(out, "cancelled")
		default:
			out = append(out, ev.GetText())
		}
	}
	return strings.Join(out, "|")
}

// sendCall makes one SendMessage and reads it to its end, or until stop
// says to stop (after a response), leaving the stream then.
func sendCall(ctx context.Context, client gatewayv1.GatewayServiceClient, req *gatewayv1.SendMessageRequest, stop func(*gatewayv1.SendMessageResponse) bool) call {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var c call
	stream, err := client.SendMessage(ctx, req)
	if err != nil {
		c.err = err
		return c
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return c
		}
		if err != nil {
			c.err = err
			return c
		}
		c.responses = append(c.responses, m)
		if stop != nil && stop(m) {
			return c
		}
	}
}

// afterText stops a call once it got an event with text.
func afterText(m *gatewayv1.SendMessageResponse) bool { return m.GetEvent().GetText() != "" }

// following starts a call that reads to its end, and returns once the call
// got a text event, so that the rest reaches it live.
func following(t *testing.T, ctx context.Context, client gatewayv1.GatewayServiceClient, req *gatewayv1.SendMessageRequest) <-chan call {
	t.Helper()
	texts, out := make(chan struct{}, 16), make(chan call, 1)
	go func() {
		out <- sendCall(ctx, client, req, func(m *gatewayv1.SendMessageResponse) bool {
			if afterText(m) {
				texts <- struct{}{}
			}
			return false
		})
	}()
	select {
	case <-texts:
	case c := <-out:
		t.Fatalf("the call ended before any text: %v %q", c.err, c.events())
	case <-time.After(time.Minute):
		t.Fatal("no text within a minute")
	}
	return out
}

// describeEntries is a thread's entries as short strings.
func describeEntries(es []*gatewayv1.ThreadEntry) string {
	var out []string
	for _, e := range es {
		switch x := e.GetEntry().(type) {
		case *gatewayv1.ThreadEntry_Message:
			out = append(out, "message:"+x.Message.GetContent())
		case *gatewayv1.ThreadEntry_Event:
			switch {
			case x.Event.GetDone() != nil:
				out = append(out, "done")
			case x.Event.GetCancelled() != nil:
				out = append(out, "cancelled")
			default:
				out = append(out, x.Event.GetText())
			}
		case *gatewayv1.ThreadEntry_Outcome:
			out = append(out, "outcome:"+strings.TrimPrefix(x.Outcome.GetEnding().String(), "ENDING_"))
		}
	}
	return strings.Join(out, "|")
}

// history reads a thread whole, in pages of size.
func readHistory(t *testing.T, ctx context.Context, client gatewayv1.GatewayServiceClient, thread string, size int32) []*gatewayv1.ThreadEntry {
	t.Helper()
	var all []*gatewayv1.ThreadEntry
	token := ""
	for {
		page, err := client.History(ctx, &gatewayv1.HistoryRequest{ThreadId: thread, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatalf("history of %s: %v", thread, err)
		}
		all = append(all, page.GetEntries()...)
		if token = page.GetNextPageToken(); token == "" {
			return all
		}
	}
}

// historyGateway starts a gateway with history on st, and returns a
// client of it and the two minutes its test may take.
func historyGateway(t *testing.T, id string, st store.Store) (context.Context, *grpc.ClientConn, gatewayv1.GatewayServiceClient) {
	conn, _ := startTuned(t, id, st, withHistory(nil))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx, conn, gatewayv1.NewGatewayServiceClient(conn)
}

func TestThreadsAndHistory(t *testing.T) {
	eachHistoryStore(t, func(t *testing.T, st store.Store) {
		ctx, conn, client := historyGateway(t, "gw-hist", st)
		startAgent(t, ctx, conn, "hist-agent", false)

		// A message without a thread gets a new one.
		one := sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "hist-agent", Sender: "ann", Content: "one"}, nil)
		thread := one.first().GetThreadId()
		if one.err != nil || one.events() != "working: one|done" || !strings.HasPrefix(thread, "thread-") {
			t.Fatalf("first message: %v %q thread %q", one.err, one.events(), thread)
		}
		for _, m := range one.responses {
			if m.GetThreadId() != thread || m.GetEntryId() == "" || m.GetReplayed() {
				t.Fatalf("response without its thread or entry: %v", m)
			}
		}
		two := sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "hist-agent", ThreadId: thread, Content: "two"}, nil)
		if two.err != nil || two.first().GetThreadId() != thread {
			t.Fatalf("second message: %v %v", two.err, two.first())
		}

		want := "message:one|working: one|done|outcome:DONE|message:two|working: two|done|outcome:DONE"
		all := readHistory(t, as(ctx, token), client, thread, 0)
		if got := describeEntries(all); got != want {
			t.Fatalf("history:\n got %s\nwant %s", got, want)
		}
		// Each response named the entry the history holds it as.
		for i, m := range append(one.responses, two.responses...) {
			j := i + i/3 // every third response is followed by an outcome entry
			if all[j].GetEntryId() != m.GetEntryId() || all[j].GetRequestId() != m.GetRequestId() {
				t.Fatalf("response %d names entry %s, the history has %s", i, m.GetEntryId(), all[j].GetEntryId())
			}
		}
		if m := all[0].GetMessage(); m.GetSender() != "ann" || m.GetClientId() == "" || all[0].GetAgentId() != "hist-agent" {
			t.Fatalf("message entry: %v", all[0])
		}
		for _, size := range []int32{1, 3} {
			if got := describeEntries(readHistory(t, as(ctx, token), client, thread, size)); got != want {
				t.Fatalf("in pages of %d: %s", size, got)
			}
		}
		// What is new since the first exchange.
		newer, err := client.History(as(ctx, token), &gatewayv1.HistoryRequest{ThreadId: thread, After: all[3].GetEntryId()})
		if err != nil || describeEntries(newer.GetEntries()) != "message:two|working: two|done|outcome:DONE" {
			t.Fatalf("after the first exchange: %v %v", describeEntries(newer.GetEntries()), err)
		}
		threads, err := client.ListThreads(as(ctx, token), &gatewayv1.ListThreadsRequest{AgentId: "hist-agent"})
		if err != nil || len(threads.GetThreads()) != 1 || threads.GetThreads()[0].GetThreadId() != thread {
			t.Fatalf("threads: %v %v", threads, err)
		}

		// Another client neither reads nor writes it, nor sees it listed.
		if _, err := client.History(as(ctx, otherToken), &gatewayv1.HistoryRequest{ThreadId: thread}); status.Code(err) != codes.NotFound {
			t.Fatalf("another client's read: %v", err)
		}
		if c := sendCall(as(ctx, otherToken), client, &gatewayv1.SendMessageRequest{AgentId: "hist-agent", ThreadId: thread, Content: "x"}, nil); status.Code(c.err) != codes.PermissionDenied {
			t.Fatalf("another client's message to the thread: %v", c.err)
		}
		theirs := sendCall(as(ctx, otherToken), client, &gatewayv1.SendMessageRequest{AgentId: "hist-agent", Content: "mine"}, nil)
		if theirs.err != nil {
			t.Fatal(theirs.err)
		}
		if l, err := client.ListThreads(as(ctx, otherToken), &gatewayv1.ListThreadsRequest{AgentId: "hist-agent"}); err != nil ||
			len(l.GetThreads()) != 1 || l.GetThreads()[0].GetThreadId() != theirs.first().GetThreadId() {
			t.Fatalf("the other client's threads: %v %v", l, err)
		}
		// An admin reads and lists every client's.
		if got := describeEntries(readHistory(t, as(ctx, adminToken), client, thread, 0)); got != want {
			t.Fatalf("the admin's read: %s", got)
		}
		if l, err := client.ListThreads(as(ctx, adminToken), &gatewayv1.ListThreadsRequest{AgentId: "hist-agent"}); err != nil || len(l.GetThreads()) != 2 ||
			l.GetThreads()[0].GetThreadId() != theirs.first().GetThreadId() {
			t.Fatalf("the admin's list, newest first: %v %v", l, err)
		}

		bad := []struct {
			name string
			req  *gatewayv1.HistoryRequest
			want codes.Code
		}{
			{"unknown thread", &gatewayv1.HistoryRequest{ThreadId: "never"}, codes.NotFound},
			{"no thread", &gatewayv1.HistoryRequest{}, codes.InvalidArgument},
			{"thread with a space", &gatewayv1.HistoryRequest{ThreadId: "a b"}, codes.InvalidArgument},
			{"malformed after", &gatewayv1.HistoryRequest{ThreadId: thread, After: "x"}, codes.InvalidArgument},
			{"malformed page token", &gatewayv1.HistoryRequest{ThreadId: thread, PageToken: "!!"}, codes.InvalidArgument},
			{"negative page size", &gatewayv1.HistoryRequest{ThreadId: thread, PageSize: -1}, codes.InvalidArgument},
		}
		for _, b := range bad {
			if _, err := client.History(as(ctx, token), b.req); status.Code(err) != b.want {
				t.Errorf("%s: %v, want %v", b.name, err, b.want)
			}
		}
	})
}

// TestMessageIsStoredBeforeItsFirstResponse: the client's message is
// written with the answer's first events, and its client is told nothing
// before: whatever it is told of the request, the message can be read
// back. A holding agent's client still gets its first response before
// the answer ends.
func TestMessageIsStoredBeforeItsFirstResponse(t *testing.T) {
	eachHistoryStore(t, func(t *testing.T, st store.Store) {
		ctx, conn, client := historyGateway(t, "gw-first", st)
		startAgent(t, ctx, conn, "quick", false)
		holding := startAgent(t, ctx, conn, "holding", true)
		for _, agent := range []string{"quick", "holding"} {
			t.Run(agent, func(t *testing.T) {
				thread := "th-first-" + agent
				stream, err := client.SendMessage(as(ctx, token), &gatewayv1.SendMessageRequest{AgentId: agent, ThreadId: thread, Content: "hi"})
				if err != nil {
					t.Fatal(err)
				}
				first, err := stream.Recv()
				if err != nil {
					t.Fatal(err)
				}
				h, err := client.History(as(ctx, token), &gatewayv1.HistoryRequest{ThreadId: thread})
				if err != nil {
					t.Fatal(err)
				}
				if es := h.GetEntries(); len(es) == 0 || es[0].GetEntryId() != first.GetEntryId() || es[0].GetMessage().GetContent() != "hi" {
					t.Fatalf("when the first response (entry %s) came, the history held %s", first.GetEntryId(), describeEntries(es))
				}
				if agent == "holding" {
					holding.done(t)
				}
				for {
					if _, err := stream.Recv(); errors.Is(err, io.EOF) {
						break
					} else if err != nil {
						t.Fatal(err)
					}
				}
				if got := describeEntries(readHistory(t, as(ctx, token), client, thread, 0)); got != "message:hi|working: hi|done|outcome:DONE" {
					t.Fatalf("history: %s", got)
				}
			})
		}
	})
}

func TestReplayAndReconnect(t *testing.T) {
	eachHistoryStore(t, func(t *testing.T, st store.Store) {
		ctx, conn, client := historyGateway(t, "gw-replay", st)
		agent := startAgent(t, ctx, conn, "slow", true)

		// The client leaves mid-answer; the request goes on.
		req := &gatewayv1.SendMessageRequest{AgentId: "slow", ThreadId: "th-replay", Content: "pay", IdempotencyKey: "order-7"}
		left := sendCall(as(ctx, token), client, req, afterText)
		if left.err != nil || left.events() != "working: pay" {
			t.Fatalf("before leaving: %v %q", left.err, left.events())
		}
		// Its retry gets what it missed, then the rest live.
		retried := following(t, as(ctx, token), client, req)
		agent.done(t)
		again := await(t, retried, "the retry")
		if again.err != nil || again.events() != "working: pay|done" || again.first().GetRequestId() != left.first().GetRequestId() || !again.first().GetReplayed() {
			t.Fatalf("retry: %v %q %v", again.err, again.events(), again.first())
		}
		// Once it ended, the answer comes from the store.
		stored := sendCall(as(ctx, token), client, req, nil)
		if stored.err != nil || stored.events() != "working: pay|done" || !stored.first().GetReplayed() {
			t.Fatalf("replay of an ended request: %v %q", stored.err, stored.events())
		}
		if got := agent.got(); len(got) != 1 {
			t.Fatalf("the agent got %v; it must get the message once", got)
		}

		// A client that reconnects to the thread mid-answer gets what it
		// missed, then the rest live.
		mid := sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "slow", ThreadId: "th-replay", Content: "ship"}, func(m *gatewayv1.SendMessageResponse) bool { return m.GetEvent() == nil })
		if mid.err != nil {
			t.Fatal(mid.err)
		}
		// One for each message: "pay" and "ship".
		await(t, agent.gotOne, "the first message to reach the agent")
		await(t, agent.gotOne, "the second message to reach the agent")
		watch, err := client.WatchThread(as(ctx, token), &gatewayv1.WatchThreadRequest{ThreadId: "th-replay", After: mid.first().GetEntryId()})
		if err != nil {
			t.Fatal(err)
		}
		var watched []*gatewayv1.ThreadEntry
		m, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		watched = append(watched, m.GetEntry())
		agent.done(t)
		for {
			m, err := watch.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			watched = append(watched, m.GetEntry())
		}
		if got := describeEntries(watched); got != "working: ship|done|outcome:DONE" {
			t.Fatalf("watched: %s", got)
		}
		want := "message:pay|working: pay|done|outcome:DONE|message:ship|working: ship|done|outcome:DONE"
		if got := describeEntries(readHistory(t, as(ctx, token), client, "th-replay", 0)); got != want {
			t.Fatalf("history:\n got %s\nwant %s", got, want)
		}
	})
}

func TestAbandonedRequestIsCancelled(t *testing.T) {
	eachHistoryStore(t, func(t *testing.T, st store.Store) {
		conn, _ := startTuned(t, "gw-detach", st, withHistory(func(c *service.Config) { c.DetachedTimeout = 100 * time.Millisecond }))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		client := gatewayv1.NewGatewayServiceClient(conn)
		startAgent(t, ctx, conn, "stuck", true)
		left := sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "stuck", ThreadId: "th-detach", Content: "q"}, afterText)
		if left.err != nil {
			t.Fatal(left.err)
		}
		// The agent cannot cancel: the gateway ends the request itself
		// once no client has followed it for the timeout.
		testenv.Eventually(t, time.Minute, "the abandoned request to be cancelled", func() bool {
			return strings.HasSuffix(describeEntries(readHistory(t, as(ctx, token), client, "th-detach", 0)), "cancelled|outcome:CANCELLED")
		})
	})
}

// startStoppable runs a replica like startTuned and returns its client
// connection and a function that stops it gracefully.
func startStoppable(t *testing.T, id string, st store.Store, tune func(*service.Config)) (*grpc.ClientConn, func()) {
	t.Helper()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(id)
	cfg.AgentTimeout = 10 * time.Minute
	cfg.ClientTokens = []string{token, otherToken}
	cfg.ClientRate, cfg.ClientBurst, cfg.ClientStreams = 1e6, 1e6, 64
	tune(&cfg)
	gw, err := service.New(cfg, service.Deps{Store: st, Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	<-gw.Ready()
	conn, err := grpc.NewClient(gw.Endpoints()[0].Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway run: %v", err)
		}
	}
	t.Cleanup(func() { _ = conn.Close(); stop() })
	return conn, stop
}

func TestReplayOnAnotherReplica(t *testing.T) {
	eachHistoryStore(t, func(t *testing.T, st store.Store) {
		connA, stopA := startStoppable(t, "gw-a", st, withHistory(nil))
		connB, _ := startStoppable(t, "gw-b", st, withHistory(nil))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		agentCtx, stopAgent := context.WithCancel(ctx)
		defer stopAgent()
		agent := startAgent(t, agentCtx, connA, "far", true)
		viaB := gatewayv1.NewGatewayServiceClient(connB)

		// Through B to the agent on A; the client leaves mid-answer.
		req := &gatewayv1.SendMessageRequest{AgentId: "far", Content: "q", IdempotencyKey: "k-far"}
		left := sendCall(as(ctx, token), viaB, req, afterText)
		if left.err != nil || !strings.HasPrefix(left.first().GetRequestId(), "gw-a.") {
			t.Fatalf("through B: %v %v", left.err, left.first())
		}
		// Retried through B: B finds the key, A has the rest.
		retried := following(t, as(ctx, token), viaB, req)
		agent.done(t)
		if c := await(t, retried, "the retry through B"); c.err != nil || c.events() != "working: q|done" || !c.first().GetReplayed() {
			t.Fatalf("retry through B: %v %q", c.err, c.events())
		}

		// A second request, in flight when A stops: its answer so far is
		// replayed from the store through B, with how it ended.
		req2 := &gatewayv1.SendMessageRequest{AgentId: "far", Content: "q2", IdempotencyKey: "k-far-2"}
		if c := sendCall(as(ctx, token), viaB, req2, afterText); c.err != nil {
			t.Fatal(c.err)
		}
		// A tells its agent to leave; the agent, holding, leaves when told.
		stopped := make(chan struct{})
		go func() { stopA(); close(stopped) }()
		stopAgent()
		await(t, stopped, "replica A to stop")
		c := sendCall(as(ctx, token), viaB, req2, nil)
		if c.events() != "working: q2" || status.Code(c.err) != codes.Unavailable || !c.first().GetReplayed() {
			t.Fatalf("replay after A stopped: %q %v", c.events(), c.err)
		}
		if c := sendCall(as(ctx, token), viaB, req, nil); c.err != nil || c.events() != "working: q|done" {
			t.Fatalf("the first request, after A stopped: %v %q", c.err, c.events())
		}
		if got := agent.got(); strings.Join(got, ",") != "q,q2" {
			t.Fatalf("the agent got %v", got)
		}
	})
}

// TestHistoryLimits: what bounds the history's readers. Without history the
// reads are UNIMPLEMENTED; a WatchThread stream holds one of its client's
// stream places, as SendMessage does; a page is at most 1000 entries
// whatever page_size asks.
func TestHistoryLimits(t *testing.T) {
	t.Parallel()
	t.Run("history off", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		conn, _ := startTuned(t, "gw-nohist", openStore(t), nil)
		client := gatewayv1.NewGatewayServiceClient(conn)
		if _, err := client.History(as(ctx, token), &gatewayv1.HistoryRequest{ThreadId: "th"}); status.Code(err) != codes.Unimplemented {
			t.Errorf("History: %v, want UNIMPLEMENTED", err)
		}
		if _, err := client.ListThreads(as(ctx, token), &gatewayv1.ListThreadsRequest{AgentId: "a"}); status.Code(err) != codes.Unimplemented {
			t.Errorf("ListThreads: %v, want UNIMPLEMENTED", err)
		}
		w, err := client.WatchThread(as(ctx, token), &gatewayv1.WatchThreadRequest{ThreadId: "th"})
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("WatchThread: %v, want UNIMPLEMENTED", err)
		}
	})

	t.Run("watching holds a stream place", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		conn, _ := startTuned(t, "gw-watchcap", openStore(t), withHistory(func(c *service.Config) { c.ClientStreams = 2 }))
		client := gatewayv1.NewGatewayServiceClient(conn)
		agent := startAgent(t, ctx, conn, "held", true)
		startAgent(t, ctx, conn, "quick", false)
		// One stream: a request the agent holds.
		sendCtx, stopSend := context.WithCancel(as(ctx, token))
		defer stopSend()
		held := following(t, sendCtx, client, &gatewayv1.SendMessageRequest{AgentId: "held", ThreadId: "th-cap", Content: "wait"})
		// Two: watching its thread, which stays open while it is answered.
		watchCtx, stopWatch := context.WithCancel(as(ctx, token))
		w, err := client.WatchThread(watchCtx, &gatewayv1.WatchThreadRequest{ThreadId: "th-cap"})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if c := sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "quick", Content: "third"}, nil); status.Code(c.err) != codes.ResourceExhausted {
			t.Fatalf("a third stream while watching: %v, want RESOURCE_EXHAUSTED", c.err)
		}
		// Reads are not streams.
		if _, err := client.History(as(ctx, token), &gatewayv1.HistoryRequest{ThreadId: "th-cap"}); err != nil {
			t.Fatalf("History at the stream cap: %v", err)
		}
		// The watch's place comes back when it ends; the gateway learns of
		// it after the client does, hence the retries.
		stopWatch()
		testenv.Eventually(t, time.Minute, "a stream after the watch ended", func() bool {
			return sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "quick", Content: "again"}, nil).err == nil
		})
		agent.done(t)
		if c := await(t, held, "the held request"); c.err != nil {
			t.Fatalf("the held request: %v", c.err)
		}
	})

	t.Run("pages are bounded", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		conn, _ := startTuned(t, "gw-pages", openStore(t), withHistory(nil))
		client := gatewayv1.NewGatewayServiceClient(conn)
		// One answer of 1100 events makes 1103 entries (message, events,
		// done, outcome), in a few writes.
		agent := registerAgent(t, ctx, conn, "chatty")
		go func() {
			m, err := agent.Recv()
			if err != nil {
				return
			}
			id := m.GetSendMessage().GetRequestId()
			for i := range 1101 {
				ev := &covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: fmt.Sprint(i)}}
				if i == 1100 {
					ev.Event = &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}
				}
				if agent.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: ev}}) != nil {
					return
				}
			}
		}()
		if c := sendCall(as(ctx, token), client, &gatewayv1.SendMessageRequest{AgentId: "chatty", ThreadId: "th-long", Content: "talk"}, nil); c.err != nil || len(c.responses) != 1102 {
			t.Fatalf("filling the thread: %d responses, %v", len(c.responses), c.err)
		}
		page, err := client.History(as(ctx, token), &gatewayv1.HistoryRequest{ThreadId: "th-long", PageSize: 1 << 30})
		if err != nil || len(page.GetEntries()) != 1000 || page.GetNextPageToken() == "" {
			t.Fatalf("a page asked for 2^30 entries: %d entries, next %q, %v; want 1000 and more to come", len(page.GetEntries()), page.GetNextPageToken(), err)
		}
		if all := readHistory(t, as(ctx, token), client, "th-long", 1<<30); len(all) != 1103 {
			t.Fatalf("the whole thread in the largest pages: %d entries, want 1103", len(all))
		}
	})
}
