package supervisor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// TestFollowMissesNoLine: a follower that subscribes and then reads the
// store has every line added before it subscribed, from the store or among
// the unstored lines Follow returns (a line logged but not yet written, as
// chunks are written every 200ms, was once lost between the two), and
// every later line live, with distinct increasing times even when added
// from several goroutines at once.
func TestFollowMissesNoLine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := openRecords(t)
	book := newLogBook(rec, slog.New(slog.DiscardHandler))
	l := book.open(ctx, "instance")
	const before, writers, each = 50, 4, 50
	for i := range before {
		l.Add(StreamACP, fmt.Sprintf("before %d", i))
	}
	live, unstored, stop := book.Follow("instance")
	defer stop()
	stored, _, err := rec.TailLogs(ctx, "instance", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var seen []records.LogLine
	for _, line := range append(stored, unstored...) {
		if len(seen) == 0 || line.Time.After(seen[len(seen)-1].Time) {
			seen = append(seen, line)
		}
	}
	if len(seen) != before {
		t.Fatalf("%d lines stored and %d unstored make %d distinct lines, want %d", len(stored), len(unstored), len(seen), before)
	}
	for i, line := range seen {
		if want := fmt.Sprintf("before %d", i); line.Text != want {
			t.Fatalf("line %d is %q, want %q", i, line.Text, want)
		}
	}

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Add(StreamStderr, fmt.Sprintf("writer %d line %d", w, i))
			}
		})
	}
	wg.Wait()
	last := seen[len(seen)-1].Time
	for range writers * each {
		line := <-live
		if !line.Time.After(last) {
			t.Fatalf("line %q at %v is not after the line before it, at %v", line.Text, line.Time, last)
		}
		last = line.Time
	}
	l.Close()
	live2, unstored, stop2 := book.Follow("instance")
	defer stop2()
	if len(unstored) != 0 {
		t.Fatalf("%d lines unstored after Close", len(unstored))
	}
	select {
	case line := <-live2:
		t.Fatalf("a line after Close: %+v", line)
	default:
	}
	all, _, err := rec.TailLogs(ctx, "instance", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != before+writers*each {
		t.Fatalf("%d lines stored, want %d", len(all), before+writers*each)
	}
}

// TestSyncStoresWhatWasAdded: after Sync, every line added before it is in
// the store, though no chunk filled and no 200ms tick came (a turn's
// status once said completed while its last lines were still batched, and
// a client reading the log then missed them).
func TestSyncStoresWhatWasAdded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := openRecords(t)
	book := newLogBook(rec, slog.New(slog.DiscardHandler))
	l := book.open(ctx, "instance")
	defer l.Close()
	for round := 1; round <= 3; round++ {
		for i := range 10 {
			l.Add(StreamACP, fmt.Sprintf("round %d line %d", round, i))
		}
		l.Sync(ctx)
		stored, _, err := rec.TailLogs(ctx, "instance", 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(stored) != round*10 || stored[len(stored)-1].Text != fmt.Sprintf("round %d line 9", round) {
			t.Fatalf("round %d: %d lines stored after Sync, want %d ending with line 9: %+v", round, len(stored), round*10, stored)
		}
	}
	l.Close()
	l.Sync(ctx) // after Close: returns at once
}
