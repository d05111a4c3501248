package service_test

import (
	"context"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// TestEventsArePublished sends envelopes to the events queue as the runner
// and the Librarian do, and receives them on task:{task_id} and system:*.
func TestEventsArePublished(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, nil), busOption{})
	console := bus.client(t, "console", "")
	console.subscribe(2, "task:*", "")
	console.subscribe(3, "system:*", "")

	status, err := structpb.NewStruct(map[string]any{"status": "running"})
	if err != nil {
		t.Fatal(err)
	}
	data, err := anypb.New(status)
	if err != nil {
		t.Fatal(err)
	}
	send := func(env *eventsv1.Envelope) {
		body, err := queue.EncodeEnvelope(env)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bus.queue.Send(context.Background(), broker.EventsQueue.Name, queue.Outgoing{Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	send(&eventsv1.Envelope{Id: "ev-1", Type: "runner.task.status_changed", Source: "runner/runner-0",
		Time: timestamppb.Now(), SubjectIds: map[string]string{"task_id": "task-789"}, Payload: data})
	id, params := console.expectRequest("sendMessage")
	payload := testenv.At[map[string]any](t, params, "payload")
	if params["topic"] != "task:task-789" || payload["type"] != "runner.task.status_changed" || payload["event_id"] != "ev-1" ||
		!contains(mustJSON(t, payload["data"]), `"status":"running"`) {
		t.Errorf("task event delivered as %v", params)
	}
	console.reply(id, `{"success":true}`)

	send(&eventsv1.Envelope{Id: "ev-2", Type: "librarian.request.approved", Source: "librarian"})
	id, params = console.expectRequest("sendMessage")
	if params["topic"] != "system:librarian.request.approved" {
		t.Errorf("governance event delivered on %v", params["topic"])
	}
	console.reply(id, `{"success":true}`)

	// A payload of a type the bus does not link (the Librarian's, for the
	// standalone bus) is published as its producer encoded it.
	unlinked := `{"@type":"type.googleapis.com/conclave.librarian.v1.RequestStatus","request_id":"r-3","status":"approved"}`
	if _, err := bus.queue.Send(context.Background(), broker.EventsQueue.Name, queue.Outgoing{
		Body: []byte(`{"id":"ev-3","type":"librarian.request.approved","source":"librarian","subject_ids":{"request_id":"r-3"},"payload":` + unlinked + `}`)}); err != nil {
		t.Fatal(err)
	}
	id, params = console.expectRequest("sendMessage")
	if got := mustJSON(t, testenv.At[map[string]any](t, params, "payload")["data"]); params["topic"] != "system:librarian.request.approved" || !contains(got, `"request_id":"r-3"`) {
		t.Errorf("an event of an unlinked type delivered as %v", params)
	}
	console.reply(id, `{"success":true}`)
}
