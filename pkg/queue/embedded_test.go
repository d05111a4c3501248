package queue

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func openTemp(t *testing.T, path string) *Embedded {
	t.Helper()
	e, err := OpenEmbedded(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func TestEmbeddedSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "q.db")
	e := openTemp(t, path)
	if err := e.Ensure(ctx, Definition{Name: "jobs", VisibilityTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Send(ctx, "jobs", Outgoing{Body: []byte("done")}, Outgoing{Body: []byte("in flight")}, Outgoing{Body: []byte("waiting")}); err != nil {
		t.Fatal(err)
	}
	msgs, err := e.Receive(ctx, "jobs", ReceiveOptions{Max: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("Receive = %d messages, %v", len(msgs), err)
	}
	if err := e.Delete(ctx, "jobs", msgs[0].ReceiptHandle); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// The definition and both unacknowledged messages, the one in flight
	// included, are back after reopening; no Ensure needed.
	e = openTemp(t, path)
	want := map[string]bool{"in flight": true, "waiting": true}
	for len(want) > 0 {
		msgs, err := e.Receive(ctx, "jobs", ReceiveOptions{Max: MaxBatch, Wait: MaxWait})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if string(m.Body) == "done" {
				t.Fatal("the deleted message came back after restart")
			}
			delete(want, string(m.Body))
			if err := e.Delete(ctx, "jobs", m.ReceiptHandle); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestEmbeddedRetention(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := openTemp(t, filepath.Join(t.TempDir(), "q.db"))
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	e.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	if err := e.Ensure(ctx, Definition{Name: "short", Retention: 2 * time.Minute, VisibilityTimeout: time.Second, MaxReceiveCount: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Send(ctx, "short", Outgoing{Body: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	advance(30 * time.Second)
	if _, err := e.Send(ctx, "short", Outgoing{Body: []byte("new")}); err != nil {
		t.Fatal(err)
	}
	advance(91 * time.Second) // "old" is 121s old, "new" 91s
	msgs, err := e.Receive(ctx, "short", ReceiveOptions{Max: MaxBatch})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || string(msgs[0].Body) != "new" {
		t.Fatalf("received %v, want only the message within retention", msgs)
	}

	// A dead letter keeps its original send time and the dead-letter
	// queue's 14-day retention applies to it.
	advance(2 * time.Second) // "new" is visible again, and still within retention
	if msgs, err := e.Receive(ctx, "short", ReceiveOptions{}); err != nil || len(msgs) != 0 {
		t.Fatalf("second receive = %v, %v; want it dead-lettered", msgs, err)
	}
	dead, err := e.Receive(ctx, "short-dlq", ReceiveOptions{})
	if err != nil || len(dead) != 1 || string(dead[0].Body) != "new" {
		t.Fatalf("dead-letter queue = %v, %v", dead, err)
	}
	if !dead[0].SentAt.Equal(msgs[0].SentAt) {
		t.Errorf("dead letter sent at %v, want the original %v", dead[0].SentAt, msgs[0].SentAt)
	}
	if err := e.ChangeVisibility(ctx, "short-dlq", dead[0].ReceiptHandle, 0); err != nil {
		t.Fatal(err)
	}
	advance(maxRetention)
	if msgs, err := e.Receive(ctx, "short-dlq", ReceiveOptions{}); err != nil || len(msgs) != 0 {
		t.Fatalf("after 14 days the dead-letter queue holds %v, %v", msgs, err)
	}
	err = e.db.View(func(tx *bolt.Tx) error {
		for _, name := range []string{"short", "short-dlq"} {
			if n := openQueue(tx, name).msgs.Stats().KeyN; n != 0 {
				t.Errorf("%s still stores %d expired messages", name, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestEmbeddedCloseEndsLongPoll(t *testing.T) {
	t.Parallel()
	e := openTemp(t, filepath.Join(t.TempDir(), "q.db"))
	if err := e.Ensure(t.Context(), Definition{Name: "idle"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Receive(t.Context(), "idle", ReceiveOptions{Wait: MaxWait})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // let it start waiting; the test holds either way
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, errClosed) {
		t.Fatalf("long poll after Close: %v, want errClosed", err)
	}
	if _, err := e.Send(t.Context(), "idle", Outgoing{Body: []byte("x")}); !errors.Is(err, errClosed) {
		t.Fatalf("Send after Close: %v, want errClosed", err)
	}
}

func TestEmbeddedCorruptRecordIsReported(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	e := openTemp(t, filepath.Join(t.TempDir(), "q.db"))
	if err := e.Ensure(ctx, Definition{Name: "damaged"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Send(ctx, "damaged", Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	err := e.update(ctx, func(tx *bolt.Tx) error {
		return openQueue(tx, "damaged").msgs.Put(seqKey(1), []byte{recordVersion, 1, 2})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Receive(ctx, "damaged", ReceiveOptions{}); !errors.Is(err, errCorrupt) {
		t.Fatalf("Receive of a damaged record: %v, want errCorrupt", err)
	}
}
