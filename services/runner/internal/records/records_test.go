package records

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
)

// LogsAfter returns exactly the chunks numbered above the one given, in
// order, a page at a time, and nothing of another instance.
func TestLogsAfter(t *testing.T) {
	t.Parallel()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	if err := store.EnsureTables(ctx, st, Table); err != nil {
		t.Fatal(err)
	}
	r := New(st)
	for seq := range int64(12) {
		line := LogLine{Time: time.Now().UTC(), Stream: "runner", Text: fmt.Sprint("line ", seq)}
		if err := r.AppendLogs(ctx, "one", seq, []LogLine{line}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.AppendLogs(ctx, "one0", 50, []LogLine{{Text: "another instance"}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		after      int64
		limit      int
		first, len int64
	}{
		{after: -1, limit: 100, first: 0, len: 12},
		{after: 4, limit: 100, first: 5, len: 7},
		{after: 4, limit: 3, first: 5, len: 3},
		{after: 11, limit: 100, len: 0},
		{after: 1000, limit: 100, len: 0},
	} {
		chunks, err := r.LogsAfter(ctx, "one", c.after, c.limit)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(chunks)) != c.len {
			t.Fatalf("after %d, limit %d: %d chunks, want %d", c.after, c.limit, len(chunks), c.len)
		}
		for i, ch := range chunks {
			want := c.first + int64(i)
			if ch.Seq != want || len(ch.Lines) != 1 || ch.Lines[0].Text != fmt.Sprint("line ", want) {
				t.Fatalf("after %d: chunk %d is %+v, want seq %d", c.after, i, ch, want)
			}
		}
	}
}
