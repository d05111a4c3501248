package service_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

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
	j := testenv.JaegerFor(t)
	provider := func(service string) *telemetry.Provider { return j.Provider(t, service) }
	r := startRunnerWith(t, map[string]string{"CONCLAVE_RUNNER_EVENTS_QUEUE": "traced-events",
		// The worker's span ends with its launch: at once after the turn.
		"CONCLAVE_RUNNER_IDLE_TIMEOUT": "1ms"}, provider("runner"))
	body := `{"task_id":"traced","agent_type":"acp-normal","workspace_path":"` + r.workspace(t) + `","env":{"TASK_DESCRIPTION":"trace me"}}`
	resp, out, traceID := j.PostTraced(t, ctx, "launch an agent", r.Base+"/api/v1/agents/launch", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("launch: HTTP %d %s", resp.StatusCode, out)
	}

	var task struct {
		InstanceIDs []string `json:"instance_ids"`
	}
	testenv.Eventually(t, time.Minute, "the task to name its instance", func() bool {
		r.Do(t, "GET", "/api/v1/tasks/traced", nil, &task)
		return len(task.InstanceIDs) > 0
	})
	instanceID := task.InstanceIDs[0]
	r.WaitLog(t, instanceID, "acp-agent: TRACEPARENT 00-"+traceID+"-")
	// The span the agent's TRACEPARENT names: its parent.
	var agentParent string
	for _, l := range r.Logs(t, instanceID) {
		if rest, ok := strings.CutPrefix(l.Text, "acp-agent: TRACEPARENT 00-"+traceID+"-"); ok {
			agentParent, _, _ = strings.Cut(rest, "-")
		}
	}
	if len(agentParent) != 16 {
		t.Fatalf("no parent span id in the agent's TRACEPARENT: %+v", r.Logs(t, instanceID))
	}

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
	// spans, the queue consumer's span of the worker, and the worker's
	// "start agent" span, which the agent's TRACEPARENT names and whose
	// parent is the consumer's, in one trace.
	var consumer, start *testenv.JaegerSpan
	for start == nil || consumer == nil {
		tr, err := j.WaitTrace(ctx, traceID, 5)
		if err != nil {
			t.Fatalf("waiting for the span the agent's TRACEPARENT names (%s): %v", agentParent, err)
		}
		consumer, start = nil, nil
		for i, s := range tr.Spans {
			if s.ServiceName == "runner" && s.Tags["span.kind"] == "consumer" {
				consumer = &tr.Spans[i]
			}
			if s.SpanID == agentParent {
				start = &tr.Spans[i]
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("trace %s: the worker's consumer span %v, the agent's parent span %s %v; spans %+v", traceID, consumer != nil, agentParent, start != nil, tr.Spans)
		}
		if start == nil || consumer == nil {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if start.OperationName != "start agent" || start.ServiceName != "runner" || start.Tags["conclave.instance_id"] != instanceID {
		t.Errorf("the agent's TRACEPARENT names span %q of %s (tags %v), want the runner's start agent span of instance %s", start.OperationName, start.ServiceName, start.Tags, instanceID)
	}
	if start.ParentSpanID != consumer.SpanID {
		t.Errorf("the start agent span's parent is %s, want the worker's consumer span %s", start.ParentSpanID, consumer.SpanID)
	}
}
