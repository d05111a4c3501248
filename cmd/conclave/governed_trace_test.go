package main

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestGovernedTurnIsOneTrace: a governed turn is one trace in a real
// Jaeger, from the client's launch: the runner's permission span, the
// Librarian's request, the decision event on the bus (a reviewer decided
// it in a trace of their own), the runner's receipt of the decision, and
// the resumed turn's events on the bus.
func TestGovernedTurnIsOneTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Jaeger, the Librarian, the bus, the runner and node")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	j := testenv.JaegerFor(t)
	e := startGoverned(t, governedOptions{protocol: escalateDeviation, telemetry: func(s string) *telemetry.Provider { return j.Provider(t, s) }})
	ws := e.root
	body := fmt.Sprintf(`{"task_id":"task-governed-trace","agent_type":%q,"workspace_path":%q,"env":{"TASK_DESCRIPTION":"trace me"}}`, governedType, ws)
	resp, out, traceID := j.PostTraced(t, ctx, "launch a governed agent", e.runnerURL+"/api/v1/agents/launch", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("launch: HTTP %d %s", resp.StatusCode, out)
	}
	var task struct {
		InstanceIDs []string `json:"instance_ids"`
	}
	testenv.Eventually(t, time.Minute, "the task to name its instance", func() bool {
		call(t, "GET", e.runnerURL+"/api/v1/tasks/task-governed-trace", "", nil, &task)
		return len(task.InstanceIDs) > 0
	})
	id := task.InstanceIDs[0]
	waiting := e.waitStatus(t, id, 3*time.Minute, "awaiting_approval", "completed", "failed")
	if waiting.Status != "awaiting_approval" {
		t.Fatalf("status %+v; log:\n%s", waiting, e.logText(t, id))
	}
	e.decide(t, path.Base(waiting.ReviewURL), "approve", "Fine.")
	if done := e.waitStatus(t, id, 2*time.Minute, "completed", "failed", "stopped"); done.Status != "completed" {
		t.Fatalf("status %+v; log:\n%s", done, e.logText(t, id))
	}

	_, err := j.WaitTraceFunc(ctx, traceID, func(tr *testenv.JaegerTrace) string {
		var approval, decision *testenv.JaegerSpan
		librarianSpans, decisionPublished, delivered, resumed := 0, false, false, false
		for i, s := range tr.Spans {
			topic := fmt.Sprint(s.Tags["messaging.destination.name"])
			switch {
			case s.ServiceName == "runner" && s.OperationName == "librarian approval":
				approval = &tr.Spans[i]
			case s.ServiceName == "runner" && s.OperationName == "librarian decision":
				decision = &tr.Spans[i]
			case s.ServiceName == "librarian":
				librarianSpans++
			case s.ServiceName == "bus" && s.OperationName == "bus publish" && topic == "system:librarian.request.approved":
				decisionPublished = true
			case s.ServiceName == "bus" && strings.HasPrefix(s.OperationName, "bus deliver") && topic == "system:librarian.request.approved" &&
				strings.HasPrefix(fmt.Sprint(s.Tags["bus.client_id"]), "runner-"):
				delivered = true
			}
		}
		for _, s := range tr.Spans {
			if decision != nil && s.ServiceName == "bus" && s.OperationName == "bus publish" &&
				s.Tags["messaging.destination.name"] == "task:task-governed-trace" && s.StartTime.After(decision.StartTime) {
				resumed = true
			}
		}
		switch {
		case approval == nil:
			return "the runner's librarian approval span"
		case librarianSpans == 0:
			return "the Librarian's spans"
		case !decisionPublished:
			return "the bus's publish of system:librarian.request.approved"
		case !delivered:
			return "the bus's delivery of the decision to the runner"
		case decision == nil:
			return "the runner's librarian decision span"
		case decision.ParentSpanID != approval.SpanID || decision.Tags["conclave.librarian.via"] != "bus":
			return fmt.Sprintf("the decision span as a child of the approval span, via the bus (parent %s, tags %v)", decision.ParentSpanID, decision.Tags)
		case !resumed:
			return "the resumed turn's events on task:task-governed-trace"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
}
