package main_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// TestScheduledSweep: EventBridge's schedule (events/scheduled-sweep.json)
// invokes the real bootstrap, which rejects the escalation past its
// deadline that nobody read, and only that one, in dynalite, with its
// librarian.request.rejected event on the bus's queue.
func TestScheduledSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary against dynalite and fauxqs")
	}
	// Not parallel: the tests share fauxqs's events queue, and this one
	// reads it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, st, q, _ := deployment(t)
	escalatedAt := time.Now().Add(-25 * time.Hour)
	reqs := requests.New(st, func() time.Time { return escalatedAt })
	escalated := func(reviewBy time.Time) string {
		id := requests.NewID()
		_, err := reqs.Create(ctx, requests.Record{ID: id, AgentID: "claude-3", State: governance.Escalated, ReviewBy: reviewBy,
			Request:  &librarianv1.AgentRequest{AgentId: "claude-3", RequestType: "APPROVAL", Action: "modify", TargetType: "design"},
			Response: &librarianv1.LibrarianResponse{RequestId: id, Status: "escalated", EscalationReason: proto.String("high risk")}})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	overdue := escalated(escalatedAt.Add(24 * time.Hour))
	waiting := escalated(time.Now().Add(time.Hour))

	rt := startFunction(t, env)
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Invoke(ctx, fixture(t, "scheduled-sweep.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Rejected int }
	if err := json.Unmarshal(res.Payload, &out); err != nil || out.Rejected != 1 {
		t.Fatalf("sweep: payload %s error %s\n%s", res.Payload, res.Error, rt.Output())
	}
	for id, want := range map[string]governance.State{overdue: governance.Rejected, waiting: governance.Escalated} {
		rec, err := reqs.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != want {
			t.Errorf("request %s is %s after the sweep, want %s", id, rec.State, want)
		}
		if want == governance.Rejected && !slices.ContainsFunc(rec.Response.GetViolations(), func(v *librarianv1.ViolationDetail) bool { return v.Rule == "escalation_timeout" }) {
			t.Errorf("the swept request has no escalation_timeout violation: %v", rec.Response)
		}
	}

	var got []string
	for len(got) == 0 {
		msgs, err := q.Receive(ctx, service.EventsQueue.Name, queue.ReceiveOptions{Max: 10, Wait: time.Second})
		if err != nil {
			t.Fatalf("%v; events so far %v", err, got)
		}
		for _, m := range msgs {
			env := &eventsv1.Envelope{}
			if err := protojson.Unmarshal(m.Body, env); err != nil {
				t.Fatal(err)
			}
			switch env.GetSubjectIds()["request_id"] {
			case overdue:
				got = append(got, env.Type)
			case waiting:
				t.Errorf("an event about the request still waiting: %s", env.Type)
			}
			_ = q.Delete(ctx, service.EventsQueue.Name, m.ReceiptHandle)
		}
	}
	if !slices.Equal(got, []string{"librarian.request.rejected"}) {
		t.Fatalf("events of the sweep %v", got)
	}
}
