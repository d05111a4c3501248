package testenv

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// EmbeddedStore is an embedded (bbolt) store in a directory of the test's,
// with tables created, closed when the test ends.
func EmbeddedStore(t testing.TB, tables ...store.Table) store.Store {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := store.EnsureTables(context.Background(), st, tables...); err != nil {
		t.Fatal(err)
	}
	return st
}

// EmbeddedQueue is an embedded queue in a directory of the test's, with
// queues created, closed when the test ends.
func EmbeddedQueue(t testing.TB, queues ...queue.Definition) queue.Queue {
	t.Helper()
	q, err := queue.OpenEmbedded(filepath.Join(t.TempDir(), "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if err := queue.EnsureAll(context.Background(), q, queues...); err != nil {
		t.Fatal(err)
	}
	return q
}
