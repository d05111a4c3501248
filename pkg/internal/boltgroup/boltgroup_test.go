package boltgroup

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var bucket = []byte("b")

func open(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "g.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	return db
}

func put(k string) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(k), []byte("v")) }
}

// One failing call in a shared commit neither undoes the others nor is
// reported as theirs.
func TestCommitIsolatesFailures(t *testing.T) {
	t.Parallel()
	db := open(t)
	w := &Writer{db: db}
	boom := errors.New("boom")
	group := []op{
		{fn: put("a"), done: make(chan error, 1)},
		{fn: func(tx *bolt.Tx) error { _ = put("partial")(tx); return boom }, done: make(chan error, 1)},
		{fn: put("b"), done: make(chan error, 1)},
	}
	w.commit(group) // on the writer's side of the channel, as run would
	for i, want := range []error{nil, boom, nil} {
		if err := <-group[i].done; !errors.Is(err, want) {
			t.Errorf("call %d: %v, want %v", i, err, want)
		}
	}
	_ = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		if b.Get([]byte("a")) == nil || b.Get([]byte("b")) == nil || b.Get([]byte("partial")) != nil {
			t.Error("the good calls' writes must stay and the failing call's must not")
		}
		return nil
	})
}

// Concurrent calls all commit. (That they share commits is a matter of
// speed, which bench/store measures.)
func TestConcurrentCallsShareCommits(t *testing.T) {
	t.Parallel()
	db := open(t)
	w := Start(db, 256)
	defer w.Stop()
	const n = 500
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() { errs <- w.Update(context.Background(), put(fmt.Sprint(i))) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	count := 0
	_ = db.View(func(tx *bolt.Tx) error { count = tx.Bucket(bucket).Stats().KeyN; return nil })
	if count != n {
		t.Fatalf("%d keys written, want %d", count, n)
	}
}

func TestStoppedWriterRefuses(t *testing.T) {
	t.Parallel()
	w := Start(open(t), 8)
	w.Stop()
	w.Stop() // idempotent
	if err := w.Update(context.Background(), put("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Update after Stop: %v, want ErrClosed", err)
	}
}
