package service_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestRetryIsOneTraceInJaeger publishes from a traced client to an agent
// that asks for a retry, and finds the publisher's span, the bus's spans,
// both of the agent's handling spans and the retry queue's consumer span in
// one trace in a real Jaeger: params._meta.traceparent carries it over the
// WebSocket hops, and the queue message's attributes across the retry.
func TestRetryIsOneTraceInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Jaeger")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j, err := testenv.StartJaeger(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Stop)
	provider := func(service string) *telemetry.Provider { return j.Provider(t, service) }
	bus := startBus(t, defaultConfig(t, nil), busOption{tel: provider("bus")})

	// The agent: a Go client whose handler spans continue the bus's trace.
	agentTracer := provider("agent").TracerProvider().Tracer("agent")
	handled := make(chan struct{}, 2)
	attempts := 0
	agent := goClient(t, ctx, bus.url, jsonrpc.Methods{
		"processMessage": func(ctx context.Context, req *jsonrpc.Request) (any, error) {
			_, span := agentTracer.Start(ctx, "agent processMessage")
			defer span.End()
			attempts++
			handled <- struct{}{}
			if attempts == 1 {
				return map[string]any{"processed": false, "should_retry": true, "retry_seconds": 1}, nil
			}
			return map[string]any{"processed": true}, nil
		},
	})
	if err := agent.Call(ctx, "initialize", map[string]any{"clientId": "traced-agent", "capabilities": map[string]bool{"processMessage": true}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := agent.Call(ctx, "subscribe", map[string]string{"topic": "agent:traced"}, nil); err != nil {
		t.Fatal(err)
	}

	pub := goClient(t, ctx, bus.url, nil)
	if err := pub.Call(ctx, "initialize", map[string]string{"clientId": "traced-publisher"}, nil); err != nil {
		t.Fatal(err)
	}
	callCtx, span := provider("publisher").TracerProvider().Tracer("publisher").Start(ctx, "publish a task")
	if err := pub.Call(callCtx, "sendMessage", map[string]any{"topic": "agent:traced", "payload": json.RawMessage(`{"type":"task_request"}`)}, nil); err != nil {
		t.Fatal(err)
	}
	span.End()
	<-handled
	<-handled
	traceID := span.SpanContext().TraceID().String()

	// publisher, bus publish, two bus deliveries, the queue's consumer
	// span, and two agent spans.
	tr, err := j.WaitTrace(ctx, traceID, 7)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]testenv.JaegerSpan{}
	count := map[string]int{}
	for _, s := range tr.Spans {
		byID[s.SpanID] = s
		count[s.ServiceName+" "+s.OperationName]++
	}
	for name, want := range map[string]int{
		"bus bus publish": 1, "bus bus deliver processMessage": 2, "bus bus-retries process": 1, "agent agent processMessage": 2,
	} {
		if count[name] != want {
			t.Errorf("%d spans %q in the trace, want %d: %v", count[name], name, want, count)
		}
	}
	root := span.SpanContext().SpanID().String()
	for _, s := range tr.Spans {
		if s.ServiceName != "agent" {
			continue
		}
		id := s.SpanID
		for seen := 0; id != "" && id != root && seen <= len(tr.Spans); seen++ {
			id = byID[id].ParentSpanID
		}
		if id != root {
			t.Errorf("agent span %s does not descend from the publisher's span", s.SpanID)
		}
	}
}

// goClient connects a pkg/jsonrpc connection to the bus.
func goClient(t *testing.T, ctx context.Context, url string, h jsonrpc.Handler) *jsonrpc.Conn {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), h)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
