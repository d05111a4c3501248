package service_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
)

// statusEvent is a runner.task.status_changed envelope as the bus reads it.
type statusEvent struct {
	ID, Status, TaskID, InstanceID, PayloadTaskID, Error string
	Trace                                                trace.SpanContext
}

// drainStatusEvents receives every message waiting on the events queue
// (deleting them) and returns the status changes of instanceID (of every
// instance for ""), in the order they were sent.
func drainStatusEvents(t *testing.T, q queue.Queue, eventsQueue, instanceID string) []statusEvent {
	t.Helper()
	return drainEvents(t, q, eventsQueue, "runner.task.status_changed", instanceID, func(env *eventsv1.Envelope, f map[string]*structpb.Value) statusEvent {
		carrier := propagation.MapCarrier{"traceparent": env.GetTraceContext().GetTraceparent()}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
		return statusEvent{ID: env.GetId(), Status: f["status"].GetStringValue(),
			TaskID: env.GetSubjectIds()["task_id"], InstanceID: env.GetSubjectIds()["instance_id"],
			PayloadTaskID: f["task_id"].GetStringValue(), Error: f["error"].GetStringValue(), Trace: sc}
	})
}

// drainEvents receives every message waiting on the events queue
// (deleting them) and returns the envelopes of type typ about instanceID
// (every instance for ""), in the order they were sent, each as event
// reads it with its payload's fields.
func drainEvents[T any](t *testing.T, q queue.Queue, eventsQueue, typ, instanceID string, event func(*eventsv1.Envelope, map[string]*structpb.Value) T) []T {
	t.Helper()
	ctx := context.Background()
	var out []T
	for {
		msgs, err := q.Receive(ctx, eventsQueue, queue.ReceiveOptions{Max: queue.MaxBatch})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			return out
		}
		for _, m := range msgs {
			if err := q.Delete(ctx, eventsQueue, m.ReceiptHandle); err != nil {
				t.Fatal(err)
			}
			env, err := queue.DecodeEnvelope(m.Body)
			if err != nil {
				t.Fatal(err)
			}
			if env.GetType() != typ || (instanceID != "" && env.GetSubjectIds()["instance_id"] != instanceID) {
				continue
			}
			var payload structpb.Struct
			if err := env.GetPayload().UnmarshalTo(&payload); err != nil {
				t.Fatal(err)
			}
			out = append(out, event(env, payload.GetFields()))
		}
	}
}

func statuses(evs []statusEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Status
	}
	return out
}

// TestStatusChangedEvents: a launch's status changes reach the events
// queue as runner.task.status_changed envelopes, starting → running →
// completed, each naming the task and the instance, all in the launch's
// trace.
func TestStatusChangedEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	// Tracing on (spans recorded in memory), so that events carry a trace.
	spans := tracetest.NewSpanRecorder()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "runner-test", SpanProcessors: []sdktrace.SpanProcessor{spans}})
	if err != nil {
		t.Fatal(err)
	}
	r := startRunnerWith(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "300ms"}, tel)
	in := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "status events"})
	r.WaitLog(t, in.ID, "launch 1 ended")
	var evs []statusEvent
	// The events are sent beside the writes: wait for the last one.
	testenv.EventuallyNoError(t, time.Minute, "the completed status event", func() error {
		evs = append(evs, drainStatusEvents(t, r.q, r.cfg.EventsQueue, in.ID)...)
		if len(evs) < 3 || evs[len(evs)-1].Status != "completed" {
			return fmt.Errorf("status events %v", statuses(evs))
		}
		return nil
	})
	if got := strings.Join(statuses(evs), " → "); got != "starting → running → completed" {
		t.Fatalf("status events: %s", got)
	}
	// The launch's trace is the one its REST request began.
	var launchTrace trace.TraceID
	for _, sp := range spans.Ended() {
		if sp.SpanKind() == trace.SpanKindServer && strings.Contains(sp.Name(), "LaunchAgent") {
			launchTrace = sp.SpanContext().TraceID()
		}
	}
	if !launchTrace.IsValid() {
		t.Fatal("no server span of the launch was recorded")
	}
	ids := map[string]bool{}
	for _, e := range evs {
		if e.TaskID != in.TaskID || e.PayloadTaskID != in.TaskID || e.InstanceID != in.ID {
			t.Errorf("%s event names task %q (payload %q), instance %q; want %q, %q", e.Status, e.TaskID, e.PayloadTaskID, e.InstanceID, in.TaskID, in.ID)
		}
		if !e.Trace.IsValid() {
			t.Errorf("%s event has no trace parent", e.Status)
		} else if e.Trace.TraceID() != launchTrace {
			t.Errorf("%s event is in trace %s, the launch in %s", e.Status, e.Trace.TraceID(), launchTrace)
		}
		if ids[e.ID] {
			t.Errorf("event id %s used twice", e.ID)
		}
		ids[e.ID] = true
	}
}

// signalWriter closes reached once a line containing want is written.
type signalWriter struct {
	want    string
	reached chan struct{}
	once    sync.Once
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.reached) })
	}
	if w.buf.Len() > 1<<20 {
		w.buf.Reset()
	}
	return len(p), nil
}

// TestEventsSurviveACrash kills the runner process (SIGKILL) after a turn's
// end is recorded and before its status event is sent (the crash point of
// CONCLAVE_RUNNER_TEST_CRASHPOINT holds the event). The event is in the
// instance's outbox, and the launch's message was not deleted: the next
// runner sends it, under its own id.
func TestEventsSurviveACrash(t *testing.T) {
	ps := newProcessState(t)
	crash := &signalWriter{want: "crashpoint before-terminal-event reached", reached: make(chan struct{})}
	first, r := ps.startWith(t, 1, []string{"CONCLAVE_RUNNER_TEST_CRASHPOINT=before-terminal-event"}, crash)
	in := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "the last event"})
	select {
	case <-crash.reached:
	case <-time.After(2 * time.Minute):
		t.Fatal("the runner never reached the crash point")
	}
	if st := r.Status(t, in.ID); st.Status != "completed" {
		t.Fatalf("at the crash point: %+v", st)
	}
	killRunner(t, first)

	second, r := ps.start(t, 1)
	// The launch comes back after CONCLAVE_RUNNER_LAUNCH_RETRY (2s), and its
	// delivery sends what the outbox holds.
	r.WaitLog(t, in.ID, "status event(s) again")
	// The embedded queue is one process's at a time.
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = second.Wait()
	q, err := queue.OpenEmbedded(filepath.Join(ps.data, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	evs := drainStatusEvents(t, q, "bus-events", in.ID)
	completed := 0
	for _, e := range evs {
		if e.Status == "completed" {
			completed++
		}
	}
	if completed != 1 || !strings.HasPrefix(strings.Join(statuses(evs), " "), "starting running") {
		t.Fatalf("status events on the queue: %v, want starting, running and one completed", statuses(evs))
	}
}

// TestEventsOutageDoesNotStopLaunches: while the events queue refuses
// every send, a replica with one worker still runs one launch after
// another (a worker once waited for its launch's events without end, so
// the first launch held the only worker), and once the queue is back each
// launch's completed event is sent from its outbox.
func TestEventsOutageDoesNotStopLaunches(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, embedded := sharedState(t, map[string]string{"CONCLAVE_RUNNER_WORKERS": "1", "CONCLAVE_RUNNER_LAUNCH_RETRY": "2s", "CONCLAVE_RUNNER_IDLE_TIMEOUT": "300ms"})
	q := &failingQueue{Queue: embedded, launches: cfg.EventsQueue}
	q.fail.Store(true)
	r, _ := runOn(t, cfg, st, q, nil)
	var ids []string
	for i := range 3 {
		in := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": fmt.Sprintf("outage %d", i)})
		r.WaitLog(t, in.ID, "launch 1 ended")
		ids = append(ids, in.ID)
	}
	q.fail.Store(false)
	// Every status event on the queue, by instance: each launch's ends
	// with completed.
	got := map[string][]string{}
	done := func() bool {
		for _, id := range ids {
			if evs := got[id]; len(evs) == 0 || evs[len(evs)-1] != "completed" {
				return false
			}
		}
		return true
	}
	testenv.EventuallyNoError(t, time.Minute, "the status events once the queue came back", func() error {
		for _, e := range drainStatusEvents(t, embedded, cfg.EventsQueue, "") {
			got[e.InstanceID] = append(got[e.InstanceID], e.Status)
		}
		if !done() {
			return fmt.Errorf("status events %v", got)
		}
		return nil
	})
}

// updateEvent is a runner.session.update envelope as the bus reads it.
type updateEvent struct {
	Kind, Text, Update string
}

// drainUpdateEvents receives every message waiting on the events queue
// (deleting them) and returns the session updates of instanceID, in the
// order they were sent.
func drainUpdateEvents(t *testing.T, q queue.Queue, eventsQueue, instanceID string) []updateEvent {
	t.Helper()
	return drainEvents(t, q, eventsQueue, "runner.session.update", instanceID, func(_ *eventsv1.Envelope, f map[string]*structpb.Value) updateEvent {
		return updateEvent{Kind: f["kind"].GetStringValue(), Text: f["text"].GetStringValue(), Update: f["update"].GetStringValue()}
	})
}

// waitUpdateEvents drains the events queue until the updates of
// instanceID include one of kind whose text contains text, and returns
// all it drained.
func waitUpdateEvents(t *testing.T, r *testRunner, instanceID, kind, text string) []updateEvent {
	t.Helper()
	var all []updateEvent
	testenv.EventuallyNoError(t, time.Minute, fmt.Sprintf("a %s event with %q on the events queue", kind, text), func() error {
		all = append(all, drainUpdateEvents(t, r.q, r.cfg.EventsQueue, instanceID)...)
		if !slices.ContainsFunc(all, func(e updateEvent) bool { return e.Kind == kind && strings.Contains(e.Text, text) }) {
			return fmt.Errorf("got %+v", all)
		}
		return nil
	})
	return all
}
