package records

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
)

func listStore(t *testing.T) store.Store {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := store.EnsureTables(context.Background(), st, Table); err != nil {
		t.Fatal(err)
	}
	return st
}

// A list item without its instance is passed over, and removed once it is
// old enough not to be a creation in progress; a list item left by a
// failed creation of an existing id is not listed twice.
func TestListInstancesStray(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := listStore(t)
	r := New(st)
	now := time.Now().UTC()
	old := &Instance{ID: "gone-old", StartedAt: now.Add(-time.Hour)}
	young := &Instance{ID: "gone-young", StartedAt: now.Add(-time.Second)}
	for _, in := range []*Instance{old, young} {
		if _, err := st.Put(ctx, Table.Name, store.Item{Key: listKey(in)}); err != nil {
			t.Fatal(err)
		}
	}
	kept := &Instance{ID: "kept", StartedAt: now.Add(-time.Minute)}
	if err := r.CreateInstance(ctx, kept); err != nil {
		t.Fatal(err)
	}
	again := &Instance{ID: "kept", StartedAt: now}
	if err := r.CreateInstance(ctx, again); err == nil {
		t.Fatal("created an existing instance again")
	}
	page, err := r.ListInstances(ctx, ListOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Instances) != 1 || page.Instances[0].ID != "kept" || page.Next != "" {
		t.Fatalf("listed %+v", page)
	}
	if _, err := st.Get(ctx, Table.Name, listKey(old)); err == nil {
		t.Error("the old stray list item is still there")
	}
	if _, err := st.Get(ctx, Table.Name, listKey(young)); err != nil {
		t.Errorf("the young stray list item is gone: %v", err)
	}
}

// With filters that pass over more list items than MaxScan, a page comes
// back short with Next set, and the listing still ends with every match.
func TestListInstancesMaxScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := New(listStore(t))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 10 {
		st := StatusCompleted
		if i == 0 {
			st = StatusFailed
		}
		if err := r.CreateInstance(ctx, &Instance{ID: fmt.Sprint("i", i), Status: st, StartedAt: base.Add(time.Duration(i) * time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	opts := ListOptions{Status: StatusFailed, Limit: 5, MaxScan: 4}
	var found []string
	for calls := 1; ; calls++ {
		page, err := r.ListInstances(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range page.Instances {
			found = append(found, in.ID)
		}
		if page.Next == "" {
			if calls != 3 {
				t.Errorf("%d calls, want 3 (4 + 4 + 2 list items)", calls)
			}
			break
		}
		if calls == 1 && len(page.Instances) != 0 {
			t.Errorf("first page: %d instances, want none", len(page.Instances))
		}
		opts.After = page.Next
	}
	if len(found) != 1 || found[0] != "i0" {
		t.Errorf("found %v, want [i0]", found)
	}
	for _, bad := range []string{"", "x", "123#a", fmt.Sprintf("%020d#", 1), fmt.Sprintf("%020d#a/b", 1), fmt.Sprintf("-%019d#a", 1)} {
		if ValidListPosition(bad) {
			t.Errorf("ValidListPosition(%q)", bad)
		}
	}
}

// landedButFailed is a store whose instance writes land and then report an
// error, as a write that timed out on its way back does.
type landedButFailed struct{ store.Store }

func (s landedButFailed) Put(ctx context.Context, table string, it store.Item, conds ...store.Condition) (store.Item, error) {
	got, err := s.Store.Put(ctx, table, it, conds...)
	if err == nil && it.Key.PK != listPK {
		return store.Item{}, fmt.Errorf("timed out (test)")
	}
	return got, err
}

// An instance whose write may have landed keeps its list item: only a
// write surely refused (the id exists) takes its list item back.
func TestCreateInstanceKeepsTheListItemOfAWriteThatMayHaveLanded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := listStore(t)
	in := &Instance{ID: "maybe", StartedAt: time.Now().UTC()}
	if err := New(landedButFailed{st}).CreateInstance(ctx, in); err == nil {
		t.Fatal("the failing store's error was not returned")
	}
	page, err := New(st).ListInstances(ctx, ListOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Instances) != 1 || page.Instances[0].ID != "maybe" {
		t.Fatalf("listed %v, want the instance that landed", page.Instances)
	}
	// The same id again is surely refused: its own list item goes.
	again := &Instance{ID: "maybe", StartedAt: in.StartedAt.Add(time.Second)}
	if err := New(st).CreateInstance(ctx, again); err == nil {
		t.Fatal("a second instance with the same id was created")
	}
	if _, err := st.Get(ctx, Table.Name, listKey(again)); err == nil {
		t.Error("the refused creation left its list item")
	}
}
