package requests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// dynalite serves the tests that run on DynamoDB; nil with -short.
var dynalite *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite))
}

// id is a valid request id numbered n (0 to 25).
func id(n int) string { return "req-" + strings.Repeat("a", 15) + string(rune('a'+n)) }

// stores are the embedded store and DynamoDB on dynalite (left out with
// -short), each with Table.
func stores(t *testing.T) map[string]store.Store {
	t.Helper()
	return testenv.Stores(t, dynalite, Table)
}

// ListDecided lists decisions latest first, on both stores: made on
// creation or on a later update, kept once the request is completed;
// undecided requests, and entries whose write of the request failed, are
// not listed; every page size gives each decision once, in order.
func TestListDecided(t *testing.T) {
	t.Parallel()
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var tick atomic.Int64
			base := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
			s := New(st, func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Millisecond) })
			create := func(n int, state governance.State) Record {
				t.Helper()
				r, err := s.Create(ctx, Record{ID: id(n), AgentID: "claude-3", State: state, Request: &librarianv1.AgentRequest{}})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			set := func(r Record, to governance.State) {
				t.Helper()
				if _, err := s.Update(ctx, r.ID, func(r *Record) error { r.State = to; return nil }); err != nil {
					t.Fatal(err)
				}
			}
			// Decided in this order: 1, 2, 5 (escalated, then approved), 3
			// (escalated, then rejected), 6 (approved, later completed).
			r1 := create(1, governance.Approved)
			create(2, governance.Rejected)
			r3 := create(3, governance.Escalated)
			create(4, governance.Validating)
			r5 := create(5, governance.Escalated)
			set(r5, governance.Approved)
			// Request 3 is rejected from a stale read: the first write's
			// condition fails, and the update is retried.
			if _, err := s.Update(ctx, r3.ID, func(r *Record) error { r.AgentID = "claude-3.5"; return nil }); err != nil {
				t.Fatal(err)
			}
			if _, err := s.UpdateFrom(ctx, r3, func(r *Record) error { r.State = governance.Rejected; return nil }); err != nil {
				t.Fatal(err)
			}
			r6 := create(6, governance.ClarificationNeeded)
			set(r1, governance.Completed)
			// A retried creation of request 2 fails: its entry is not
			// listed, and is removed.
			if _, err := s.Create(ctx, Record{ID: id(2), State: governance.Approved, Request: &librarianv1.AgentRequest{}}); !errors.Is(err, store.ErrConditionFailed) {
				t.Fatalf("created request 2 again: %v", err)
			}
			want := []string{r6.ID, r3.ID, r5.ID, id(2), r1.ID}
			for _, size := range []int{1, 2, 3, 5, 6, 100} {
				var got []string
				after := ""
				for pages := 1; ; pages++ {
					page, err := s.ListDecided(ctx, size, after)
					if err != nil {
						t.Fatal(err)
					}
					if len(page.Records) > size || pages > 10 {
						t.Fatalf("page size %d: page %d of %d records", size, pages, len(page.Records))
					}
					for _, r := range page.Records {
						got = append(got, r.ID)
						if r.DecidedAt.IsZero() || !Decided(r.State) && r.State != governance.Completed {
							t.Errorf("listed %s, %s, decided at %v", r.ID, r.State, r.DecidedAt)
						}
					}
					if page.Next == "" {
						break
					}
					after = page.Next
				}
				if !slices.Equal(got, want) {
					t.Errorf("page size %d: listed %v, want %v", size, got, want)
				}
			}
			// The retried update and the refused creation left no entry
			// behind: one per decision.
			entries, err := st.Query(ctx, Table.Name, store.Query{PK: decidedPK, Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			if len(entries.Items) != len(want) {
				t.Errorf("%d decided entries for %d decisions", len(entries.Items), len(want))
			}
			// The completed request keeps the time it was approved.
			page, err := s.ListDecided(ctx, 100, "")
			if err != nil {
				t.Fatal(err)
			}
			if last := page.Records[len(page.Records)-1]; last.State != governance.Completed || !last.DecidedAt.Equal(r1.CreatedAt) {
				t.Errorf("completed request: %s decided at %v, created at %v", last.State, last.DecidedAt, r1.CreatedAt)
			}
			if _, err := s.ListDecided(ctx, 10, "garbage"); err == nil {
				t.Error("listed after a malformed position")
			}
		})
	}
}

func TestValidDecidedPosition(t *testing.T) {
	t.Parallel()
	good := fmt.Sprintf("%020d#%s", 5, id(1))
	if !ValidDecidedPosition(good) {
		t.Errorf("%q is refused", good)
	}
	for _, bad := range []string{"", "#", good[1:], fmt.Sprintf("%020d#req-x", 5), fmt.Sprintf("%019dx#%s", 5, id(1)), good + "#"} {
		if ValidDecidedPosition(bad) {
			t.Errorf("%q is accepted", bad)
		}
	}
}
