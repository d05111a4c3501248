package service_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// flakyQueue is the real embedded queue with an outage switch.
type flakyQueue struct {
	queue.Queue
	down     atomic.Bool
	failures atomic.Int32
}

func (f *flakyQueue) Send(ctx context.Context, name string, msgs ...queue.Outgoing) ([]string, error) {
	if f.down.Load() {
		f.failures.Add(1)
		return nil, errors.New("queue unreachable")
	}
	return f.Queue.Send(ctx, name, msgs...)
}

// TestEventsSurviveAQueueOutage: while the queue is down, requests are
// still decided and their events stay staged with them; the next read of
// the request publishes them, once.
func TestEventsSurviveAQueueOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	real, err := queue.OpenEmbedded(filepath.Join(dir, "queue.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	if err := real.Ensure(ctx, service.EventsQueue); err != nil {
		t.Fatal(err)
	}
	q := &flakyQueue{Queue: real}
	lib, err := service.NewHandler(service.Config{APIRate: "60/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second, AgentTokens: []string{"copilot-2=" + copilotToken}},
		service.Deps{Store: st, Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: newServer(t, lib), lib: lib, st: st, queue: real}
	q.down.Store(true)
	resp := e.do(t, "POST", "/agent/request", copilotToken, map[string]any{"agent_id": "copilot-2", "request_type": "QUERY", "content": "auth"}).response(t)
	if got := e.events(t); len(got) != 0 {
		t.Fatalf("events sent while the queue was down: %v", types(got))
	}
	// The send was tried 1 + max_retry_attempts (3) times.
	if n := q.failures.Load(); n != 4 {
		t.Fatalf("%d sends during the outage, want 4", n)
	}
	q.down.Store(false)
	for range 2 {
		if r := e.do(t, "GET", "/agent/status/"+resp.RequestId, copilotToken, nil); r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
	}
	if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.submitted", "librarian.request.approved"}) {
		t.Fatalf("events after the outage: %v", got)
	}
}

// heldClearStore is the real embedded store whose first one-op Write (the
// clear of a new request's outbox) waits for release, and which tells when
// a read (GET) is counted against the read rate.
type heldClearStore struct {
	store.Store
	held    atomic.Bool
	release chan struct{}
	read    chan struct{}
	once    sync.Once
}

func (s *heldClearStore) Write(ctx context.Context, ops ...store.Op) ([]store.Item, error) {
	if len(ops) == 1 && s.held.CompareAndSwap(false, true) {
		<-s.release
	}
	return s.Store.Write(ctx, ops...)
}

func (s *heldClearStore) Add(ctx context.Context, table string, key store.Key, delta int64, expiresAt time.Time) (int64, error) {
	n, err := s.Store.Add(ctx, table, key, delta, expiresAt)
	if strings.HasSuffix(key.PK, "#read") {
		s.once.Do(func() { close(s.read) })
	}
	return n, err
}

// TestEventsOnceWhileTheClearIsInFlight: the answer to a submission does
// not wait for the write that clears its published events; a read of the
// request meanwhile waits for that write instead of sending the events
// again.
func TestEventsOnceWhileTheClearIsInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	bolt, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queue.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := store.EnsureTables(ctx, bolt, service.Tables...); err != nil {
		t.Fatal(err)
	}
	if err := q.Ensure(ctx, service.EventsQueue); err != nil {
		t.Fatal(err)
	}
	st := &heldClearStore{Store: bolt, release: make(chan struct{}), read: make(chan struct{})}
	lib, err := service.NewHandler(service.Config{APIRate: "60/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second, AgentTokens: []string{"copilot-2=" + copilotToken}},
		service.Deps{Store: st, Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: newServer(t, lib), lib: lib, st: bolt, queue: q}
	// The clear is released once a read of the request has begun, after
	// the answer.
	go func() {
		select {
		case <-st.read:
		case <-time.After(time.Minute):
			t.Error("no read began within a minute: the answer waited for the clearing write")
		}
		close(st.release)
	}()
	resp := e.do(t, "POST", "/agent/request", copilotToken, map[string]any{"agent_id": "copilot-2", "request_type": "QUERY", "content": "auth"}).response(t)
	if r := e.do(t, "GET", "/agent/status/"+resp.RequestId, copilotToken, nil); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.submitted", "librarian.request.approved"}) {
		t.Fatalf("events: %v, want each once", got)
	}
	if r := e.do(t, "GET", "/agent/status/"+resp.RequestId, copilotToken, nil); r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	if got := e.events(t); len(got) != 0 {
		t.Fatalf("events sent again by a later read: %v", types(got))
	}
}
