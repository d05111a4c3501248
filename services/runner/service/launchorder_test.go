package service_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// watchedQueue reports what happens to the launches of one instance: each
// receipt's receive count, and deletes.
type watchedQueue struct {
	queue.Queue
	launches, instanceID string
	received             chan int
	deleted              chan struct{}
	receipts             sync.Map // the instance's launches' receipt handles
}

func (w *watchedQueue) Receive(ctx context.Context, name string, opts queue.ReceiveOptions) ([]queue.Message, error) {
	msgs, err := w.Queue.Receive(ctx, name, opts)
	for _, m := range msgs {
		var body struct {
			InstanceID string `json:"instance_id"`
		}
		if name == w.launches && json.Unmarshal(m.Body, &body) == nil && body.InstanceID == w.instanceID {
			w.receipts.Store(m.ReceiptHandle, true)
			w.received <- m.ReceiveCount
		}
	}
	return msgs, err
}

func (w *watchedQueue) Delete(ctx context.Context, name, receipt string) error {
	if _, ours := w.receipts.LoadAndDelete(receipt); ours {
		close(w.deleted)
	}
	return w.Queue.Delete(ctx, name, receipt)
}

// TestLaunchReceivedBeforeItsInstance: the API writes an instance and queues
// its launch at once, so another runner's worker may receive the launch
// before the instance is in the store. It must not drop the launch: it
// tries again soon, and the launch runs once the instance is there. Soon:
// with the launch retry at 10 minutes, the launch is back in seconds, not
// at its visibility's end (which delayed such launches by the default
// 30 s, found by e2e's Kubernetes shape, two replicas).
func TestLaunchReceivedBeforeItsInstance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Parallel()
	cfg, st, embedded := sharedState(t, map[string]string{"CONCLAVE_RUNNER_LAUNCH_RETRY": "10m"})
	const id = "0123456789abcdef0123456789abcdef"
	q := &watchedQueue{Queue: embedded, launches: cfg.LaunchQueue, instanceID: id,
		received: make(chan int, 16), deleted: make(chan struct{})}
	r, _ := runOn(t, cfg, st, q, nil)
	workspace := r.workspace(t)
	ctx := context.Background()

	// The launch first, as a runner whose instance write is still in
	// progress would leave it.
	if _, err := embedded.Send(ctx, cfg.LaunchQueue, queue.Outgoing{Body: []byte(`{"instance_id":"` + id + `","seq":1}`)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.received:
	case <-q.deleted:
		t.Fatal("the launch was received and dropped")
	}
	// The first attempt found no instance; the launch must come back,
	// long before the launch retry would bring it.
	select {
	case n := <-q.received:
		if n < 2 {
			t.Fatalf("receive count %d after the first attempt", n)
		}
	case <-q.deleted:
		t.Fatal("a launch whose instance was not written yet was dropped")
	case <-time.After(2 * time.Minute):
		t.Fatal("a launch received before its instance's write was not back after 2 minutes: it waits for its visibility (the launch retry, 10m) to end")
	}
	in := &records.Instance{ID: id, TaskID: "task-" + t.Name(), AgentType: "acp-normal", Status: records.StatusStarting,
		StartedAt: time.Now().UTC(), Workspace: workspace, Turn: 1, Prompt: "late write", LaunchSeq: 1}
	if err := records.New(st).CreateInstance(ctx, in); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range q.received {
		}
	}()
	if done := r.WaitStatus(t, id, "completed", "failed", "stopped"); done.Status != "completed" {
		t.Fatalf("status %+v; logs %+v", done, r.Logs(t, id))
	}
}
