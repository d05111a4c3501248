package api

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

func followRecords(t *testing.T) *records.Records {
	t.Helper()
	return records.New(testenv.EmbeddedStore(t, records.Table))
}

// followStored, taking over from a live follower, skips what the live
// follower sent, sends every later line, follows a launch still in
// progress, and ends once the launch has ended and its lines are sent.
func TestFollowStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := followRecords(t)
	in := &records.Instance{ID: "follow", TaskID: "t", Status: records.StatusRunning, LaunchSeq: 1}
	if err := rec.CreateInstance(ctx, in); err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC()
	line := func(i int) records.LogLine {
		return records.LogLine{Time: base.Add(time.Duration(i) * time.Millisecond), Stream: "runner", Text: fmt.Sprint("line ", i)}
	}
	// Chunk 0 is the tail; chunk 1's first two lines went out live.
	for seq, lines := range [][]records.LogLine{{line(0)}, {line(1), line(2), line(3)}, {line(4)}} {
		if err := rec.AppendLogs(ctx, in.ID, int64(seq), lines); err != nil {
			t.Fatal(err)
		}
	}
	s := &Server{rec: rec}
	got := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		done <- s.followStored(ctx, in.ID, 0, line(2).Time, func(l records.LogLine) error {
			got <- l.Text
			return nil
		})
	}()
	for _, want := range []string{"line 3", "line 4"} {
		if l := <-got; l != want {
			t.Fatalf("got %q, want %q", l, want)
		}
	}
	// The launch goes on: a later chunk is followed, then the launch ends.
	if err := rec.AppendLogs(ctx, in.ID, 3, []records.LogLine{line(5)}); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l != "line 5" {
		t.Fatalf("got %q, want line 5", l)
	}
	if _, err := rec.UpdateInstance(ctx, in.ID, func(in *records.Instance) error { in.DoneSeq = 1; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := rec.AppendLogs(ctx, in.ID, 4, []records.LogLine{line(6)}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(got)
	var rest []string
	for l := range got {
		rest = append(rest, l)
	}
	if len(rest) != 1 || rest[0] != "line 6" {
		t.Fatalf("after the launch ended: %q, want the line stored as it ended", rest)
	}
}

// followStored ends when the instance is deleted.
func TestFollowStoredDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := followRecords(t)
	if err := rec.CreateInstance(ctx, &records.Instance{ID: "gone", TaskID: "t", LaunchSeq: 1}); err != nil {
		t.Fatal(err)
	}
	s := &Server{rec: rec}
	done := make(chan error, 1)
	go func() {
		done <- s.followStored(ctx, "gone", -1, time.Time{}, func(records.LogLine) error { return nil })
	}()
	if err := rec.DeleteInstance(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
