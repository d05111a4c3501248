package service_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestLaunchIsOneTrace follows a launch from a client's span through the
// REST call, the queue and the worker (spans in a real Jaeger), into the
// agent's TRACEPARENT, and back out on the agent's session/update event.
func TestLaunchIsOneTrace(t *testing.T) {
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
	r := startRunnerWith(t, map[string]string{"CONCLAVE_RUNNER_EVENTS_QUEUE": "traced-events",
		// The worker's span ends with its launch: at once after the turn.
		"CONCLAVE_RUNNER_IDLE_TIMEOUT": "1ms"}, provider("runner"))
	client := provider("client")
	callCtx, span := client.TracerProvider().Tracer("client").Start(ctx, "launch an agent")
	traceID := span.SpanContext().TraceID().String()

	body := `{"task_id":"traced","agent_type":"acp-normal","workspace_path":"` + r.workspace(t) + `","env":{"TASK_DESCRIPTION":"trace me"}}`
	req, _ := http.NewRequestWithContext(callCtx, "POST", r.base+"/api/v1/agents/launch", strings.NewReader(body))
	propagation.TraceContext{}.Inject(callCtx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	span.End()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("launch: HTTP %d", resp.StatusCode)
	}

	var instanceID string
	for instanceID == "" {
		var task struct {
			InstanceIDs []string `json:"instance_ids"`
		}
		r.do(t, "GET", "/api/v1/tasks/traced", nil, &task)
		if len(task.InstanceIDs) > 0 {
			instanceID = task.InstanceIDs[0]
		}
	}
	r.waitLog(t, instanceID, "acp-agent: TRACEPARENT 00-"+traceID+"-")

	// Its session/update came out as an event of the same trace.
	found := false
	for !found {
		msgs, err := r.q.Receive(ctx, "traced-events", queue.ReceiveOptions{Max: 10, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			env, err := queue.DecodeEnvelope(m.Body)
			if err != nil {
				t.Fatal(err)
			}
			if env.GetType() == "runner.session.update" && env.GetSubjectIds()["task_id"] == "traced" {
				if !strings.Contains(env.GetTraceContext().GetTraceparent(), traceID) {
					t.Fatalf("event %s has trace context %v, want trace %s", env.GetId(), env.GetTraceContext(), traceID)
				}
				found = true
			}
		}
	}

	// Jaeger holds the client's span, the runner's REST and gRPC server
	// spans, and the queue consumer's span of the worker, in one trace.
	tr, err := j.WaitTrace(ctx, traceID, 5)
	if err != nil {
		t.Fatal(err)
	}
	var consumer bool
	for _, s := range tr.Spans {
		if s.ServiceName == "runner" && s.Tags["span.kind"] == "consumer" {
			consumer = true
		}
	}
	if !consumer {
		t.Errorf("trace %s lacks the worker's consumer span: %+v", traceID, tr.Spans)
	}
}
