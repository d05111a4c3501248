package queue_test

// The consumer's half of the queue contract (runContract runs it on both
// backends): Consume's delivery of many messages, abandoned and failed
// handlers, the visibility heartbeat, and a graceful stop.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
)

func testTenThousand(t *testing.T, e env) {
	const n = 10_000
	def := newQueue(t, e.q, queue.Definition{})
	msgs := make([]queue.Outgoing, n)
	for i := range msgs {
		msgs[i] = body(fmt.Sprintf("msg-%05d", i))
	}
	ids := send(t, e.q, def.Name, msgs...)
	if len(ids) != n {
		t.Fatalf("%d ids, want %d", len(ids), n)
	}
	var (
		mu         sync.Mutex
		seen       = map[string]int{}
		duplicates int
	)
	const visibility = 2 * time.Second
	acks := newAckLog(e.q, visibility)
	// Longer than ctx's two minutes: with -race on a loaded machine the
	// consumer alone has taken more than that.
	c, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	err := queue.Consume(c, acks, def.Name, func(_ context.Context, m queue.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[string(m.Body)]++
		if seen[string(m.Body)] > 1 {
			duplicates++
		}
		if len(seen) == n {
			cancel()
		}
		return nil
	}, queue.ConsumerOptions{Workers: 8, MaxBatch: queue.MaxBatch, Visibility: visibility})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages received, want %d", len(seen), n)
	}
	for i := range n {
		if b := fmt.Sprintf("msg-%05d", i); seen[b] == 0 {
			t.Fatalf("%s never received", b)
		}
	}
	t.Logf("%d duplicate deliveries before deletion (allowed by at-least-once)", duplicates)
	// Handled is not deleted: a delete that came after its handle's
	// visibility ran out (a heartbeat late under load) does not count, and
	// a duplicate that a worker held when Consume stopped was released. So
	// messages may be left; take them until none comes back for longer than
	// the visibility of the consumer's last receives. What may never come
	// back is a message deleted while in flight.
	drain, stop := context.WithTimeout(ctx(t), time.Minute)
	defer stop()
	left := 0
	for {
		msgs, err := acks.Receive(drain, def.Name, queue.ReceiveOptions{Max: queue.MaxBatch, Wait: 5 * time.Second, Visibility: time.Minute})
		if err != nil {
			t.Fatalf("draining what the consumer left: %v", err)
		}
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			if seen[string(m.Body)] == 0 {
				t.Fatalf("left in the queue: %q, which the consumer never had", m.Body)
			}
			if err := acks.Delete(drain, def.Name, m.ReceiptHandle); err != nil {
				t.Fatal(err)
			}
		}
		left += len(msgs)
	}
	acked, late, redelivered := acks.result()
	t.Logf("%d messages deleted in flight, %d deletes after the visibility ran out, %d messages left", acked, late, left)
	if len(redelivered) > 0 {
		t.Fatalf("%d deleted message(s) delivered again, first %s", len(redelivered), redelivered[0])
	}
	// Without acknowledgements the check above would have checked nothing.
	if acked < n/2 {
		t.Fatalf("only %d of %d messages deleted in flight", acked, n)
	}
}

// testAbandoned is a consumer that dies holding a message: it never deletes
// it nor extends it, so another consumer gets it after the visibility
// timeout.
func testAbandoned(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{VisibilityTimeout: time.Second})
	send(t, e.q, def.Name, body("orphan"))
	crashed := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{})

	got := make(chan queue.Message, 1)
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	err := queue.Consume(c, e.q, def.Name, func(_ context.Context, m queue.Message) error {
		got <- m
		cancel()
		return nil
	}, queue.ConsumerOptions{Visibility: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := <-got
	if m.ID != crashed.ID || m.ReceiveCount != 2 {
		t.Fatalf("survivor got %+v, want %s on its second receive", m, crashed.ID)
	}
}

func testConsumerFailures(t *testing.T, e env) {
	// Without the backoff the message would be back in a minute.
	soon := func(int) time.Duration { return 0 }
	for _, tc := range []struct {
		name    string
		fail    func() error
		backoff func(int) time.Duration
	}{
		{"Error", func() error { return errors.New("downstream unavailable") }, soon},
		{"Panic", func() error { panic("handler bug") }, soon},
		// The handler's own delay wins over the backoff's (and the
		// visibility's) minutes.
		{"RetryAfter", func() error { return queue.RetryAfter(errors.New("written in a moment"), 0) },
			func(int) time.Duration { return 15 * time.Minute }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			def := newQueue(t, e.q, queue.Definition{VisibilityTimeout: time.Minute})
			send(t, e.q, def.Name, body("retry me"))
			var counts []int
			c, cancel := context.WithCancel(ctx(t))
			defer cancel()
			err := queue.Consume(c, e.q, def.Name, func(_ context.Context, m queue.Message) error {
				counts = append(counts, m.ReceiveCount)
				if m.ReceiveCount == 1 {
					return tc.fail()
				}
				cancel()
				return nil
			}, queue.ConsumerOptions{
				Logger:     slog.New(slog.NewTextHandler(t.Output(), nil)),
				Visibility: time.Minute,
				Backoff:    tc.backoff,
			})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(counts) != "[1 2]" {
				t.Fatalf("handler saw receive counts %v, want [1 2]", counts)
			}
		})
	}
}

func testHeartbeat(t *testing.T, e env) {
	// A handler that takes more than twice the visibility timeout. Without
	// the heartbeat its message would be delivered again meanwhile.
	const visibility = 4 * time.Second
	def := newQueue(t, e.q, queue.Definition{VisibilityTimeout: visibility})
	send(t, e.q, def.Name, body("slow"))
	var calls atomic.Int32
	started, finished := make(chan struct{}), make(chan struct{})
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	consumed := make(chan error, 1)
	go func() {
		consumed <- queue.Consume(c, e.q, def.Name, func(context.Context, queue.Message) error {
			if calls.Add(1) == 1 {
				close(started)
				<-finished
			}
			return nil
		}, queue.ConsumerOptions{Workers: 2, Visibility: visibility})
	}()
	<-started
	// While the handler runs, no one else may get the message.
	expectNone(t, e.q, def.Name, 2*visibility)
	close(finished)
	cancel()
	if err := <-consumed; err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
}

func testGracefulStop(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{})
	send(t, e.q, def.Name, body("in hand"))
	started, release := make(chan string, 1), make(chan struct{})
	var finished atomic.Bool
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	consumed := make(chan error, 1)
	go func() {
		consumed <- queue.Consume(c, e.q, def.Name, func(hctx context.Context, m queue.Message) error {
			started <- m.ReceiptHandle
			<-release
			finished.Store(true)
			// The stop request must not cancel the handler's own work.
			return hctx.Err()
		}, queue.ConsumerOptions{Workers: 3})
	}()
	handle := <-started
	cancel()
	close(release)
	if err := <-consumed; err != nil {
		t.Fatalf("Consume after cancel: %v, want nil", err)
	}
	if !finished.Load() {
		t.Fatal("Consume returned before the handler in progress finished")
	}
	// The finished message was deleted, not left for redelivery.
	if err := e.q.ChangeVisibility(ctx(t), def.Name, handle, 0); !errors.Is(err, queue.ErrInvalidReceipt) {
		t.Fatalf("message still in flight after graceful stop (%v)", err)
	}
}
