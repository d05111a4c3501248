package supervisor

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
)

// TestEventsAfterClose: an event raised after the publisher has closed (a
// request still draining at shutdown) is sent on its own, not a panic.
func TestEventsAfterClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := openQueues(t, "events")
	e := newEvents(q, "events", "test", slog.New(slog.DiscardHandler), func(int) {})
	e.Publish(ctx, EventStatusChanged, "task", "before", map[string]any{"status": "running"})
	closing, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.Close(closing)
	e.Publish(ctx, EventStatusChanged, "task", "after", map[string]any{"status": "stopped"})
	got := map[string]bool{}
	for len(got) < 2 {
		msgs, err := q.Receive(ctx, "events", queue.ReceiveOptions{Max: queue.MaxBatch, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			env, err := queue.DecodeEnvelope(m.Body)
			if err != nil {
				t.Fatal(err)
			}
			got[env.GetSubjectIds()["instance_id"]] = true
		}
	}
	if !got["before"] || !got["after"] {
		t.Fatalf("events sent: %v", got)
	}
}

// TestLogAfterClose: a line added after an instance's log has closed (a
// cancel's line as its launch ends) is stored, not a panic.
func TestLogAfterClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := openRecords(t)
	l := newLogBook(rec, slog.New(slog.DiscardHandler)).open(ctx, "instance")
	l.Add(StreamRunner, "before")
	l.Close()
	l.Add(StreamRunner, "after")
	lines, _, err := rec.TailLogs(ctx, "instance", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0].Text != "before" || lines[1].Text != "after" {
		t.Fatalf("stored lines %+v", lines)
	}
}
