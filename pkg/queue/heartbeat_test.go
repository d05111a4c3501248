package queue

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// expiredHandles answers every ChangeVisibility as a queue does for a handle
// whose visibility ran out before the extension landed, and counts the
// attempts per handle.
type expiredHandles struct {
	Queue
	mu       sync.Mutex
	attempts map[string]int
	first    chan struct{}
}

func (q *expiredHandles) ChangeVisibility(_ context.Context, _, handle string, _ time.Duration) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.attempts[handle]++
	if q.attempts[handle] == 1 {
		close(q.first)
	}
	return ErrInvalidReceipt
}

// A heartbeat that finds its handle out of flight stops extending it: no
// later extension of that handle can succeed, and retrying it every tick
// only adds load to a queue already too slow to extend in time.
func TestHeartbeatDropsHandleOutOfFlight(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := openTemp(t, filepath.Join(t.TempDir(), "q.db"))
	if err := e.Ensure(ctx, Definition{Name: "jobs"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Send(ctx, "jobs", Outgoing{Body: []byte("slow")}); err != nil {
		t.Fatal(err)
	}
	q := &expiredHandles{Queue: e, attempts: map[string]int{}, first: make(chan struct{})}
	const visibility = time.Second // a heartbeat every half second
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consumed := make(chan error, 1)
	go func() {
		consumed <- Consume(cctx, q, "jobs", func(context.Context, Message) error {
			select {
			case <-q.first:
			case <-time.After(time.Minute):
				t.Error("no heartbeat within a minute of the handler's start")
			}
			// Four more heartbeats' time: before the fix each one asked
			// again.
			time.Sleep(2 * visibility)
			cancel()
			return nil
		}, ConsumerOptions{Visibility: visibility})
	}()
	select {
	case err := <-consumed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Consume did not return within two minutes of its handler's end")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for h, n := range q.attempts {
		if n != 1 {
			t.Errorf("handle %s: %d extensions asked, want 1 (the first found it out of flight)", h, n)
		}
	}
	if len(q.attempts) != 1 {
		t.Errorf("%d handles extended, want 1", len(q.attempts))
	}
}
