package agentstream_test

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
)

type agentClient = grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage]

func connectWith(t *testing.T, c covenpb.CovenControlClient, id string, features ...string) agentClient {
	t.Helper()
	s := open(t, c)
	if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: id, ProtocolFeatures: features,
	}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("register %s: %v %v", id, m, err)
	}
	return s
}

// nextRequest reads the agent's next SendMessage.
func nextRequest(t *testing.T, s agentClient) *covenpb.SendMessage {
	t.Helper()
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if m.GetSendMessage() == nil {
		t.Fatalf("want SendMessage, got %v", m)
	}
	return m.GetSendMessage()
}

func respond(t *testing.T, s agentClient, r *covenpb.MessageResponse) {
	t.Helper()
	if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}}); err != nil {
		t.Fatal(err)
	}
}

func text(id, s string) *covenpb.MessageResponse {
	return &covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: s}}
}

func done(id string) *covenpb.MessageResponse {
	return &covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "ok"}}}
}

// collect reads a request's events until they end.
func collect(r *agentstream.Request) []agentstream.Event {
	var evs []agentstream.Event
	for ev := range r.Events {
		evs = append(evs, ev)
	}
	return evs
}

func TestSendStreamsReplyInOrder(t *testing.T) {
	t.Parallel()
	opts := agentstream.Options{}
	dropped := countDropped(t, &opts)
	svc, c := start(t, opts)
	agent := connectWith(t, c, "a1")
	req, err := svc.Send(context.Background(), "a1", &covenpb.SendMessage{ThreadId: "t", Sender: "me", Content: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	got := nextRequest(t, agent)
	if got.GetRequestId() != req.ID || got.GetContent() != "hi" || got.GetThreadId() != "t" || got.GetSender() != "me" {
		t.Fatalf("agent got %v for request %s", got, req.ID)
	}
	respond(t, agent, &covenpb.MessageResponse{RequestId: req.ID, Event: &covenpb.MessageResponse_Thinking{Thinking: "hmm"}})
	respond(t, agent, text(req.ID, "a"))
	respond(t, agent, &covenpb.MessageResponse{RequestId: req.ID, Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{Id: "t1", Name: "ls"}}})
	respond(t, agent, done(req.ID))
	evs := collect(req)
	if len(evs) != 4 || evs[0].Response.GetThinking() != "hmm" || evs[1].Response.GetText() != "a" ||
		evs[2].Response.GetToolUse().GetName() != "ls" || evs[3].Response.GetDone() == nil {
		t.Fatalf("events = %v", evs)
	}
	// A response after done is for a finished request: dropped and counted.
	respond(t, agent, text(req.ID, "late"))
	respond(t, agent, &covenpb.MessageResponse{RequestId: "someone-else", Event: &covenpb.MessageResponse_Text{Text: "x"}})
	_ = agent.CloseSend()
	finalStatus(agent)
	if n := dropped(); n != 2 {
		t.Fatalf("dropped = %v, want 2", n)
	}
}

func TestOneRequestAtATimeAndBoundedQueue(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{QueueDepth: 1})
	agent := connectWith(t, c, "a1")
	first, err := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := nextRequest(t, agent); got.GetRequestId() != first.ID {
		t.Fatalf("first request is %s", got.GetRequestId())
	}
	second, err := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "3"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third request: %v, want ResourceExhausted", err)
	}
	// The second reaches the agent only after the first is done.
	respond(t, agent, text(first.ID, "x"))
	respond(t, agent, done(first.ID))
	if got := nextRequest(t, agent); got.GetRequestId() != second.ID {
		t.Fatalf("second request is %s", got.GetRequestId())
	}
	if evs := collect(first); len(evs) != 2 {
		t.Fatalf("first got %d events", len(evs))
	}
	respond(t, agent, &covenpb.MessageResponse{RequestId: second.ID, Event: &covenpb.MessageResponse_Error{Error: "failed"}})
	if evs := collect(second); len(evs) != 1 || evs[0].Response.GetError() != "failed" {
		t.Fatalf("second got %v", evs)
	}
}

func TestAgentDisconnectFailsPendingRequests(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	agent := connectWith(t, c, "a1")
	inflight, _ := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "1"})
	queued, _ := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "2"})
	nextRequest(t, agent)
	respond(t, agent, text(inflight.ID, "partial"))
	_ = agent.CloseSend()
	for name, r := range map[string]*agentstream.Request{"in flight": inflight, "queued": queued} {
		evs := collect(r)
		last := evs[len(evs)-1]
		if status.Code(last.Err) != codes.Unavailable {
			t.Errorf("%s request ended with %v, want Unavailable", name, last)
		}
	}
	if _, err := svc.Send(context.Background(), "a1", &covenpb.SendMessage{}); status.Code(err) != codes.NotFound {
		t.Errorf("send to a gone agent: %v", err)
	}
}

func TestCancelReachesAgent(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	agent := connectWith(t, c, "a1", "cancellation")
	req, _ := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "long"})
	nextRequest(t, agent)
	if !svc.Cancel(context.Background(), req.ID, "user asked") {
		t.Fatal("Cancel reported an unknown request")
	}
	m, err := agent.Recv()
	if err != nil || m.GetCancelRequest().GetRequestId() != req.ID || m.GetCancelRequest().GetReason() != "user asked" {
		t.Fatalf("agent got %v, %v", m, err)
	}
	respond(t, agent, &covenpb.MessageResponse{RequestId: req.ID, Event: &covenpb.MessageResponse_Cancelled{Cancelled: &covenpb.Cancelled{Reason: "user asked"}}})
	evs := collect(req)
	if len(evs) != 1 || evs[0].Response.GetCancelled().GetReason() != "user asked" {
		t.Fatalf("events = %v", evs)
	}
	if svc.Cancel(context.Background(), req.ID, "again") {
		t.Fatal("cancelling a finished request reported true")
	}
}

func TestCancelWithoutAgentSupportWaitsForAgent(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	agent := connectWith(t, c, "old-agent")
	first, _ := svc.Send(context.Background(), "old-agent", &covenpb.SendMessage{Content: "1"})
	second, _ := svc.Send(context.Background(), "old-agent", &covenpb.SendMessage{Content: "2"})
	nextRequest(t, agent)
	svc.Cancel(context.Background(), first.ID, "stop")
	if evs := collect(first); len(evs) != 1 || evs[0].Response.GetCancelled() == nil {
		t.Fatalf("caller should see cancelled at once, got %v", evs)
	}
	// The agent, unaware, finishes its work; only then comes the next one.
	respond(t, agent, text(first.ID, "ignored"))
	respond(t, agent, done(first.ID))
	if got := nextRequest(t, agent); got.GetRequestId() != second.ID {
		t.Fatalf("next request is %s", got.GetRequestId())
	}
}

func TestCallerLeavingCancelsAgentWork(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	agent := connectWith(t, c, "a1", "cancellation")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := svc.Send(ctx, "a1", &covenpb.SendMessage{Content: "1"})
	nextRequest(t, agent)
	cancel()
	m, err := agent.Recv()
	if err != nil || m.GetCancelRequest().GetRequestId() != req.ID {
		t.Fatalf("agent got %v, %v; want CancelRequest", m, err)
	}
}

// TestRequestTakenOutOfLineNeverReachesAgent takes the second of three
// queued requests out of line, by cancelling or abandoning it: the agent
// gets the third next.
func TestRequestTakenOutOfLineNeverReachesAgent(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		takeOut func(t *testing.T, svc *agentstream.Service, first, queued *agentstream.Request)
	}{
		{"cancelled", func(t *testing.T, svc *agentstream.Service, _, queued *agentstream.Request) {
			svc.Cancel(context.Background(), queued.ID, "changed my mind")
		}},
		{"abandoned", func(t *testing.T, _ *agentstream.Service, first, queued *agentstream.Request) {
			if first.Abandon() {
				t.Fatal("Abandon of the request in flight reported it unsent")
			}
			for range 2 { // and again: abandoned stays abandoned
				if !queued.Abandon() {
					t.Fatal("Abandon of a queued request reported it sent")
				}
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			svc, c := start(t, agentstream.Options{})
			agent := connectWith(t, c, "a1")
			first, _ := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "1"})
			queued, _ := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "2"})
			third, _ := svc.Send(context.Background(), "a1", &covenpb.SendMessage{Content: "3"})
			nextRequest(t, agent)
			tt.takeOut(t, svc, first, queued)
			respond(t, agent, done(first.ID))
			if got := nextRequest(t, agent); got.GetRequestId() != third.ID {
				t.Fatalf("agent got %s after a %s queued request, want %s", got.GetRequestId(), tt.name, third.ID)
			}
		})
	}
}

// TestSendRacingDisconnectNeverHangs sends requests while the agent goes
// away: each one is either refused or ends, none waits forever. (It once
// could: a request queued after the dispatcher stopped but before the agent
// was deregistered was never answered.)
func TestSendRacingDisconnectNeverHangs(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	for round := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := c.AgentStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprint("racer-", round)
		_ = s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}})
		if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
			t.Fatalf("register: %v %v", m, err)
		}
		var accepted []*agentstream.Request
		cancel()
		for {
			req, err := svc.Send(context.Background(), id, &covenpb.SendMessage{Content: "x"})
			if err != nil {
				break
			}
			accepted = append(accepted, req)
		}
		for _, r := range accepted {
			evs := collect(r)
			if last := evs[len(evs)-1]; status.Code(last.Err) != codes.Unavailable {
				t.Fatalf("round %d: request ended with %v, want UNAVAILABLE", round, last)
			}
		}
	}
}

// TestEndedRequestIsNotCancelled: an agent that answers at once is never
// told to cancel what it has ended. The dispatcher waits for the agent's
// end or its caller's; both are ready when the answer came first, and
// select picks among ready cases at random, which once sent such an agent
// a CancelRequest now and then ("the caller went away").
func TestEndedRequestIsNotCancelled(t *testing.T) {
	t.Parallel()
	svc, c := start(t, agentstream.Options{})
	agent := connectWith(t, c, "fast", "cancellation")
	for i := range 300 {
		req, err := svc.Send(context.Background(), "fast", &covenpb.SendMessage{Content: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		got := nextRequest(t, agent) // fails on a CancelRequest for the one before
		respond(t, agent, done(got.GetRequestId()))
		if evs := collect(req); len(evs) != 1 || evs[0].Response.GetDone() == nil {
			t.Fatalf("request %d: %v", i, evs)
		}
	}
}

// TestSendCarriesTraceContext: the caller's span reaches the agent in
// SendMessage's trace_context (W3C form); a caller without one sends none.
func TestSendCarriesTraceContext(t *testing.T) {
	t.Parallel()
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sampled := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, Remote: true}))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want map[string]string
	}{
		{"a caller's span", sampled, map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		{"no span", context.Background(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			svc, c := start(t, agentstream.Options{})
			agent := connectWith(t, c, "traced")
			req, err := svc.Send(tc.ctx, "traced", &covenpb.SendMessage{Content: "hi"})
			if err != nil {
				t.Fatal(err)
			}
			got := nextRequest(t, agent)
			if !maps.Equal(got.GetTraceContext(), tc.want) {
				t.Fatalf("trace_context = %v, want %v", got.GetTraceContext(), tc.want)
			}
			respond(t, agent, done(req.ID))
			collect(req)
			_ = agent.CloseSend()
			finalStatus(agent)
		})
	}
}
