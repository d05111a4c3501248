package hostlink

import (
	"context"
	"slices"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// agent-host continues the TRACEPARENT it is given: its spans (the run,
// its ACP calls, its gRPC stream) are in that trace in a real Jaeger, the
// agent's updates carry it to the runner, and the agent's TRACEPARENT is
// agent-host's span.
func TestTrace(t *testing.T) {
	integration(t)
	j := testenv.JaegerFor(t)
	rig := startHub(t, "")
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	var (
		mu           sync.Mutex
		updateTraces []string
		rec          = newRecorder()
	)
	opts := rec.options()
	record := opts.OnUpdate
	opts.OnUpdate = func(ctx context.Context, u acp.Update) {
		mu.Lock()
		updateTraces = append(updateTraces, trace.SpanContextFromContext(ctx).TraceID().String())
		mu.Unlock()
		record(ctx, u)
	}
	link := rig.hub.Expect("inst-trace", 1, opts)
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-trace", workspace: t.TempDir(),
		env: map[string]string{"TRACEPARENT": "00-" + traceID + "-00f067aa0ba902b7-01",
			"OTEL_EXPORTER_OTLP_ENDPOINT": j.OTLPEndpoint, "OTEL_EXPORTER_OTLP_INSECURE": "true"},
		agent: []string{acpAgentBin}})
	if _, err := link.PromptTurn(t.Context(), 1, "trace me", acceptTimeout); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	firstTurn := len(updateTraces)
	mu.Unlock()
	// A turn the runner prompts in a trace of its own (a gateway client's)
	// continues it in agent-host, and its updates come back in it.
	const clientTrace, clientSpan = "5cf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
	tid, _ := trace.TraceIDFromHex(clientTrace)
	sid, _ := trace.SpanIDFromHex(clientSpan)
	clientCtx := trace.ContextWithRemoteSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	if _, err := link.PromptTurn(clientCtx, 2, "the client's turn", acceptTimeout); err != nil {
		t.Fatal(err)
	}
	_ = link.Close()
	if code := p.wait(t); code != 0 {
		t.Fatalf("agent-host exited %d", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if firstTurn == 0 || len(updateTraces) == firstTurn {
		t.Fatalf("updates of the two turns: %d, %d", firstTurn, len(updateTraces)-firstTurn)
	}
	for i, id := range updateTraces {
		want := traceID
		if i >= firstTurn {
			want = clientTrace
		}
		if id != want {
			t.Fatalf("update %d is in trace %s, want %s", i, id, want)
		}
	}
	ct, err := j.WaitTrace(t.Context(), clientTrace, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s := ct.Span("acp session/prompt"); s == nil || s.ParentSpanID != clientSpan {
		t.Errorf("the client's turn's acp session/prompt does not continue its trace: %+v", s)
	}
	tr, err := j.WaitTrace(t.Context(), traceID, 4)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, s := range tr.Spans {
		if s.ServiceName == "conclave-agent-host" {
			ops = append(ops, s.OperationName)
		}
	}
	for _, want := range []string{"agent-host", "acp initialize", "acp session/new", "acp session/prompt"} {
		if !slices.Contains(ops, want) {
			t.Errorf("no %q span of agent-host in the trace; its spans: %q", want, ops)
		}
	}
	if root := tr.Span("agent-host"); root == nil || root.ParentSpanID != "00f067aa0ba902b7" {
		t.Errorf("agent-host's span does not continue the TRACEPARENT it was given: %+v", root)
	}
}
