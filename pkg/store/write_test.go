package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
)

// TestWrite: puts (with conditions), deletes and adds across tables in one
// write, each as its single-item form would do it.
func TestWrite(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		if err := s.EnsureTable(ctx, store.Table{Name: "counts"}); err != nil {
			t.Fatal(err)
		}
		exp := c.Now().Add(time.Minute)
		old, err := s.Put(ctx, "items", store.Item{Key: key("w", "old"), Data: []byte("v1")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(ctx, "items", store.Item{Key: key("w", "gone")}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Add(ctx, "counts", key("c", "live"), 5, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Add(ctx, "counts", key("c", "expiring"), 7, exp); err != nil {
			t.Fatal(err)
		}
		c.Advance(time.Minute) // c/expiring is gone: an add restarts it
		exp = c.Now().Add(time.Minute)
		out, err := s.Write(ctx,
			store.PutOp("items", store.Item{Key: key("w", "new"), Data: []byte("n"), Attrs: map[string]string{"state": "a"}}, store.IfNotExists()),
			store.PutOp("items", store.Item{Key: key("w", "old"), Data: []byte("v2")}, store.IfVersion(old.Version)),
			store.PutOp("items", store.Item{Key: key("w", "blind"), Data: []byte("b")}),
			store.DeleteOp("items", key("w", "gone"), store.IfExists()),
			store.AddOp("counts", key("c", "live"), 2, exp),
			store.AddOp("counts", key("c", "fresh"), 3, exp),
			store.AddOp("counts", key("c", "expiring"), 1, time.Time{}),
		)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 7 || out[0].Version != 1 || out[1].Version != 2 || out[2].Version != 1 || string(out[1].Data) != "v2" {
			t.Fatalf("write returned %+v", out)
		}
		for _, want := range []struct {
			sk   string
			data string
			ver  int64
		}{{"new", "n", 1}, {"old", "v2", 2}, {"blind", "b", 1}} {
			got, err := s.Get(ctx, "items", key("w", want.sk))
			if err != nil || string(got.Data) != want.data || got.Version != want.ver {
				t.Errorf("%s = %+v, %v", want.sk, got, err)
			}
		}
		if _, err := s.Get(ctx, "items", key("w", "gone")); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("deleted item: %v", err)
		}
		for sk, want := range map[string]struct {
			n   int64
			exp time.Time
		}{"live": {7, time.Time{}}, "fresh": {3, exp}, "expiring": {1, time.Time{}}} {
			got, err := s.Get(ctx, "counts", key("c", sk))
			if err != nil || got.Counter != want.n || !got.ExpiresAt.Equal(want.exp) {
				t.Errorf("counter %s = %+v, %v; want %d expiring %v", sk, got, err, want.n, want.exp)
			}
		}
	})
}

// TestWriteConditionFails: a write whose first op's condition fails
// writes nothing, on every backend, and says which op failed.
func TestWriteConditionFails(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		if _, err := s.Put(ctx, "items", store.Item{Key: key("f", "taken")}); err != nil {
			t.Fatal(err)
		}
		_, err := s.Write(ctx,
			store.PutOp("items", store.Item{Key: key("f", "taken")}, store.IfNotExists()),
			store.PutOp("items", store.Item{Key: key("f", "other")}),
			store.AddOp("items", key("f", "count"), 1, time.Time{}),
		)
		if !errors.Is(err, store.ErrConditionFailed) {
			t.Fatalf("err = %v, want ErrConditionFailed", err)
		}
		for _, sk := range []string{"other", "count"} {
			if _, err := s.Get(ctx, "items", key("f", sk)); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s written by a failed write: %v", sk, err)
			}
		}
		if _, err := s.Write(ctx, store.DeleteOp("items", key("f", "taken"), store.IfVersion(9))); !errors.Is(err, store.ErrConditionFailed) {
			t.Errorf("delete with a wrong version: %v", err)
		}
	})
}

// TestWriteAtomicity: a failed condition on a later op. The embedded
// backend rolls the earlier ones back; dynalite has no TransactWriteItems
// (it answers UnknownOperationException), so the DynamoDB backend applies
// the ops in order there and the ones before the failure stay written.
func TestWriteAtomicity(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.open(t, newClock())
			if err := s.EnsureTable(ctx, store.Table{Name: "items"}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Put(ctx, "items", store.Item{Key: key("a", "taken")}); err != nil {
				t.Fatal(err)
			}
			_, err := s.Write(ctx,
				store.PutOp("items", store.Item{Key: key("a", "first")}, store.IfNotExists()),
				store.AddOp("items", key("a", "count"), 1, time.Time{}),
				store.PutOp("items", store.Item{Key: key("a", "taken")}, store.IfNotExists()),
			)
			if !errors.Is(err, store.ErrConditionFailed) {
				t.Fatalf("err = %v, want ErrConditionFailed", err)
			}
			_, firstErr := s.Get(ctx, "items", key("a", "first"))
			_, countErr := s.Get(ctx, "items", key("a", "count"))
			switch b.name {
			case "embedded":
				if !errors.Is(firstErr, store.ErrNotFound) || !errors.Is(countErr, store.ErrNotFound) {
					t.Errorf("a failed write left items: %v, %v", firstErr, countErr)
				}
			case "dynamodb":
				if firstErr != nil || countErr != nil {
					t.Errorf("dynalite: the ops before the failure are not written: %v, %v", firstErr, countErr)
				}
			}
		})
	}
}

// TestWriteConcurrent: concurrent writes that each create an item and
// count it; on the embedded backend they share commits.
func TestWriteConcurrent(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		const workers, each = 8, 10
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					_, err := s.Write(ctx,
						store.PutOp("items", store.Item{Key: key("cw", fmt.Sprintf("%d-%d", w, i))}, store.IfNotExists()),
						store.AddOp("items", key("cw-count", "n"), 1, time.Time{}),
					)
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		got, err := s.Get(ctx, "items", key("cw-count", "n"))
		if err != nil || got.Counter != workers*each {
			t.Fatalf("count = %+v, %v; want %d", got, err, workers*each)
		}
		page, err := s.Query(ctx, "items", store.Query{PK: "cw", Limit: 1000})
		if err != nil || len(page.Items) != workers*each {
			t.Fatalf("%d items, %v", len(page.Items), err)
		}
	})
}

func TestAddMany(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		exp := c.Now().Add(time.Minute)
		if _, err := s.Add(ctx, "items", key("m", "a"), 10, exp); err != nil {
			t.Fatal(err)
		}
		got, err := s.AddMany(ctx, "items", []store.Counter{{Key: key("m", "a"), Delta: 1}, {Key: key("m", "b"), Delta: 2, ExpiresAt: exp}})
		if err != nil || len(got) != 2 || got[0] != 11 || got[1] != 2 {
			t.Fatalf("AddMany = %v, %v", got, err)
		}
		c.Advance(time.Minute)
		if got, err = s.AddMany(ctx, "items", []store.Counter{{Key: key("m", "a"), Delta: 1}}); err != nil || got[0] != 1 {
			t.Fatalf("after expiry = %v, %v", got, err)
		}
		if _, err := s.AddMany(ctx, "missing", []store.Counter{{Key: key("m", "a"), Delta: 1}}); !errors.Is(err, store.ErrTableNotFound) {
			t.Errorf("missing table: %v", err)
		}
	})
}

func TestWriteInvalid(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		many := make([]store.Op, store.MaxWriteOps+1)
		for i := range many {
			many[i] = store.DeleteOp("items", key("x", fmt.Sprint(i)))
		}
		big := make([]store.Op, 11)
		for i := range big {
			big[i] = store.PutOp("items", store.Item{Key: key("x", fmt.Sprint(i)), Data: make([]byte, 390<<10)})
		}
		tests := []struct {
			name string
			ops  []store.Op
			want error
		}{
			{"no ops", nil, store.ErrInvalid},
			{"zero op", []store.Op{{}}, store.ErrInvalid},
			{"too many", many, store.ErrInvalid},
			{"one item twice", []store.Op{store.DeleteOp("items", key("x", "1")), store.AddOp("items", key("x", "1"), 1, time.Time{})}, store.ErrInvalid},
			{"no table", []store.Op{store.DeleteOp("", key("x", "1"))}, store.ErrInvalid},
			{"bad key", []store.Op{store.AddOp("items", key("", "1"), 1, time.Time{})}, store.ErrInvalid},
			{"bad attr", []store.Op{store.PutOp("items", store.Item{Key: key("x", "1"), Attrs: map[string]string{"a b": "c"}})}, store.ErrInvalid},
			{"zero condition", []store.Op{store.PutOp("items", store.Item{Key: key("x", "1")}, store.Condition{})}, store.ErrInvalid},
			{"over 4 MB", big, store.ErrItemTooLarge},
			{"missing table", []store.Op{store.PutOp("missing", store.Item{Key: key("x", "1")}, store.IfNotExists())}, store.ErrTableNotFound},
		}
		for _, tt := range tests {
			if _, err := s.Write(ctx, tt.ops...); !errors.Is(err, tt.want) {
				t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
			}
		}
		if _, err := s.AddMany(ctx, "items", nil); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("AddMany of nothing: %v", err)
		}
	})
}
