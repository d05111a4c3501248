package service_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// TestForwardingBetweenReplicas connects an agent to replica A and a client
// to replica B, which share a store: B lists the agent, forwards the
// client's message to A, relays the reply, forwards a cancellation, and the
// forwarded call stays in the client's trace.
func TestForwardingBetweenReplicas(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test", SpanProcessors: []trace.SpanProcessor{rec}})
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t)
	connA, _ := startReplica(t, "gw-a", st, tel)
	connB, _ := startReplica(t, "gw-b", st, tel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoAgent(t, ctx, connA, "far-agent")

	clientB := gatewayv1.NewGatewayServiceClient(connB)
	list, err := clientB.ListAgents(authed(ctx), &gatewayv1.ListAgentsRequest{})
	if err != nil || len(list.Agents) != 1 || list.Agents[0].GetServerId() != "gw-a" {
		t.Fatalf("replica B lists %v, %v; want far-agent on gw-a", list.GetAgents(), err)
	}
	got, err := clientB.GetAgent(authed(ctx), &gatewayv1.GetAgentRequest{AgentId: "far-agent"})
	if err != nil || got.Agent.GetServerId() != "gw-a" {
		t.Fatalf("GetAgent via B: %v %v", got, err)
	}

	tracer := tel.TracerProvider().Tracer("client")
	spanCtx, span := tracer.Start(authed(ctx), "client call")
	texts, requestID := readReply(t, spanCtx, clientB, &gatewayv1.SendMessageRequest{AgentId: "far-agent", Content: "over there"})
	span.End()
	if strings.Join(texts, "|") != "echo: over there|done:over there" || !strings.HasPrefix(requestID, "gw-a.") {
		t.Fatalf("reply %v for request %s", texts, requestID)
	}

	// Every server span of the call, on both replicas, is in the client's
	// trace: B's handling and A's, reached through B's forwarding client.
	traceID := span.SpanContext().TraceID()
	serverSpans := func() []string {
		var names []string
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == traceID && s.SpanKind() == oteltrace.SpanKindServer && strings.HasSuffix(s.Name(), "/SendMessage") {
				names = append(names, s.Name())
			}
		}
		return names
	}
	// A server span ends after its status is sent, so the client may see
	// the end of the stream first: wait for both to be recorded.
	testenv.Eventually(t, time.Minute, "the SendMessage server spans of both replicas", func() bool {
		return len(serverSpans()) >= 2
	})
	if got := serverSpans(); len(got) != 2 {
		t.Fatalf("want the SendMessage server spans of both replicas in trace %s, got %v", traceID, got)
	}

	// A cancellation sent to B for a request A assigned reaches A.
	if resp, err := clientB.CancelMessage(authed(ctx), &gatewayv1.CancelMessageRequest{RequestId: requestID}); err != nil || resp.Cancelled {
		t.Fatalf("cancel of a finished request via B: %v %v (want false: it already ended)", resp, err)
	}
	if _, err := clientB.CancelMessage(authed(ctx), &gatewayv1.CancelMessageRequest{RequestId: "gw-gone.abc"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("cancel for a replica that does not exist: %v", err)
	}

	// Without credentials B refuses before anything is forwarded.
	s, err := clientB.SendMessage(ctx, &gatewayv1.SendMessageRequest{AgentId: "far-agent"})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("unauthenticated call: %v", err)
	}

	// When the agent leaves A, B answers NOT_FOUND.
	cancel()
	testenv.EventuallyNoError(t, time.Minute, "NOT_FOUND from B after the agent left", func() error {
		s, err := clientB.SendMessage(authed(context.Background()), &gatewayv1.SendMessageRequest{AgentId: "far-agent"})
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return fmt.Errorf("SendMessage: %v", err)
	})
}
