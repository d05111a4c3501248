package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// TestForwardedRequestIsOneTraceInJaeger sends a client's message through
// replica B, which forwards it to replica A holding the agent, and finds the
// client's span, B's and A's server spans and B's forwarding call in one
// trace in a real Jaeger, A's server span a child of B's call.
func TestForwardedRequestIsOneTraceInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Started first, so it stops last: the replicas export spans while
	// they shut down.
	j := testenv.JaegerFor(t)
	provider := func(service string) *telemetry.Provider { return j.Provider(t, service) }
	st := openStore(t)
	connA, _ := startReplica(t, "gw-a", st, provider("gateway-a"))
	connB, _ := startReplica(t, "gw-b", st, provider("gateway-b"))
	agentCtx, stopAgent := context.WithCancel(ctx)
	defer stopAgent()
	echoAgent(t, agentCtx, connA, "traced-agent")

	client := provider("client")
	callCtx, span := client.TracerProvider().Tracer("client").Start(authed(ctx), "ask traced-agent")
	readReply(t, callCtx, gatewayv1.NewGatewayServiceClient(connB), &gatewayv1.SendMessageRequest{AgentId: "traced-agent", Content: "trace me"})
	span.End()
	traceID := span.SpanContext().TraceID().String()

	// The client's span and its gRPC call, B's server span and forwarding
	// call, and A's server span, which may end (and arrive) after the
	// client has seen the end of the stream.
	tr, err := j.WaitTrace(ctx, traceID, 5)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]testenv.JaegerSpan{}
	for _, s := range tr.Spans {
		byID[s.SpanID] = s
	}
	var serverA, serverB *testenv.JaegerSpan
	for i, s := range tr.Spans {
		if !strings.HasSuffix(s.OperationName, "/SendMessage") || s.Tags["span.kind"] != "server" {
			continue
		}
		switch s.ServiceName {
		case "gateway-a":
			serverA = &tr.Spans[i]
		case "gateway-b":
			serverB = &tr.Spans[i]
		}
	}
	if serverA == nil || serverB == nil {
		t.Fatalf("trace %s lacks a replica's server span: %+v", traceID, tr.Spans)
	}
	// descends reports whether span id has ancestor among its parents.
	descends := func(id, ancestor string) bool {
		for seen := 0; id != "" && seen < len(tr.Spans); seen++ {
			if id = byID[id].ParentSpanID; id == ancestor {
				return true
			}
		}
		return false
	}
	root := span.SpanContext().SpanID().String()
	if !descends(serverB.SpanID, root) {
		t.Errorf("B's server span does not descend from the client's span %s: %+v", root, tr.Spans)
	}
	if !descends(serverA.SpanID, serverB.SpanID) {
		t.Errorf("A's server span does not descend from B's server span: %+v", tr.Spans)
	}
	if parent := byID[serverA.ParentSpanID]; parent.ServiceName != "gateway-b" || parent.Tags["span.kind"] != "client" {
		t.Errorf("A's server span's parent is %+v, want B's forwarding call", parent)
	}
}
