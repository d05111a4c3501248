package broker

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/conclave-ai/conclave/pkg/store"
)

// countingLauncher counts launches and refuses them.
type countingLauncher struct{ n atomic.Int32 }

func (l *countingLauncher) Launch(context.Context, LaunchRequest) error {
	l.n.Add(1)
	return errors.New("no launches in this test")
}

// TestEventsAreNotForTheDefaultHandler: an event nobody subscribes to is
// not routed, and the default handler does not launch an agent for it. The
// runner's events about an agent the default handler launched are on
// task:{that agent's id}; were they taken, each launch would launch
// another agent, without end (found by the end-to-end scenario).
func TestEventsAreNotForTheDefaultHandler(t *testing.T) {
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := store.EnsureTables(context.Background(), st, LaunchTable); err != nil {
		t.Fatal(err)
	}
	l := &countingLauncher{}
	b := New(Options{ServerID: "test", Logger: slog.New(slog.DiscardHandler),
		DefaultHandler: NewDefaultHandler(DefaultHandlerOptions{Launcher: l, Store: st, Workspace: "/ws",
			BusURL: func() string { return "ws://127.0.0.1:1" }, ServerID: "test", Logger: slog.New(slog.DiscardHandler)})})
	res, err := b.PublishEvent(context.Background(), "task:agent-0123456789abcdef", []byte(`{"type":"runner.task.status_changed","event_id":"ev-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if res.Success || len(res.Acks) != 0 {
		t.Errorf("an event nobody subscribes to: %+v, want not routed", res)
	}
	if n := l.n.Load(); n != 0 {
		t.Errorf("the event launched %d agents", n)
	}
}
