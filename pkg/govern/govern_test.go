package govern

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// These are unit tests of this package's own logic, against a stand-in
// Librarian and a stand-in bus; the real ones are in cmd/conclave's
// governed tests.

// fakeLibrarian answers /agent/request with the status its answer func
// gives, and /agent/status/{id} with the status set for id.
type fakeLibrarian struct {
	mu       sync.Mutex
	answer   func(n int) (int, string) // HTTP status, decision
	calls    int
	keys     []string
	statuses map[string]string
	reads    atomic.Int32
}

func (f *fakeLibrarian) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/agent/request":
		f.calls++
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		code, status := f.answer(f.calls)
		if code != http.StatusOK {
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":{"code":%d,"status":"forbidden","message":"agent x is not in agents.yaml"}}`, code)
			return
		}
		resp := &librarianv1.LibrarianResponse{RequestId: "req-1", Status: status, Timestamp: timestamppb.Now(), Feedback: "because"}
		if status == "escalated" {
			url := "http://librarian/review/req-1"
			resp.HumanReviewUrl = &url
		}
		if status == "rejected" {
			resp.Violations = []*librarianv1.ViolationDetail{{Rule: "deviations_and_risk", Description: "a deviation"}}
		}
		if status == "approved" {
			resp.Constraints = []string{"stay in the workspace"}
		}
		b, _ := marshal.Marshal(resp)
		w.Write(b)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/agent/status/"):
		f.reads.Add(1)
		id := strings.TrimPrefix(r.URL.Path, "/agent/status/")
		b, _ := marshal.Marshal(&librarianv1.RequestStatus{RequestId: id, Status: f.statuses[id],
			Response: &librarianv1.LibrarianResponse{RequestId: id, Status: f.statuses[id], Feedback: "Approved by reviewer alice: fine"}})
		w.Write(b)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeLibrarian) setStatus(id, status string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses[id] = status
}

// fakeBus is a WebSocket JSON-RPC peer that takes initialize and
// subscribe, and publishes what publish is given to every subscriber.
type fakeBus struct {
	mu    sync.Mutex
	conns []*jsonrpc.Conn
	subs  chan struct{}
}

func (b *fakeBus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	conn := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), jsonrpc.Methods{
		"initialize": func(context.Context, *jsonrpc.Request) (any, error) { return map[string]any{}, nil },
		"ping":       func(context.Context, *jsonrpc.Request) (any, error) { return map[string]any{}, nil },
		"subscribe": func(ctx context.Context, _ *jsonrpc.Request) (any, error) {
			conn, _ := jsonrpc.ConnFromContext(ctx)
			b.mu.Lock()
			b.conns = append(b.conns, conn)
			b.mu.Unlock()
			b.subs <- struct{}{}
			return map[string]any{"success": true}, nil
		},
	})
	<-conn.Done()
}

func (b *fakeBus) publish(t *testing.T, payload string) {
	t.Helper()
	b.mu.Lock()
	conns := append([]*jsonrpc.Conn(nil), b.conns...)
	b.mu.Unlock()
	for _, c := range conns {
		var ack map[string]any
		_ = c.Call(context.Background(), "sendMessage", json.RawMessage(`{"topic":"system:librarian.request.approved","payload":`+payload+`}`), &ack)
		if ack["processed"] != false || ack["stopPropagation"] != false {
			t.Errorf("ack %v: the watcher must let every other subscriber see the event", ack)
		}
	}
}

// dropAll closes every subscriber's connection.
func (b *fakeBus) dropAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
	b.conns = nil
}

func decisionEvent(id, status string) string {
	return fmt.Sprintf(`{"type":"librarian.request.%s","event_id":"e1","source":"librarian","subject_ids":{"request_id":%q,"agent_id":"a"},`+
		`"data":{"@type":"type.googleapis.com/conclave.librarian.v1.RequestStatus","request_id":%q,"status":%q,"response":{"request_id":%q,"status":%q,"feedback":"Approved by reviewer alice: fine"}}}`,
		status, id, id, status, id, status)
}

type recorder struct {
	mu     sync.Mutex
	asked  []string
	waited []string
	closed []string
}

func (r *recorder) Asked(o string) { r.mu.Lock(); r.asked = append(r.asked, o); r.mu.Unlock() }
func (r *recorder) Waited(_ time.Duration, o string) {
	r.mu.Lock()
	r.waited = append(r.waited, o)
	r.mu.Unlock()
}
func (r *recorder) FailedClosed(o string) { r.mu.Lock(); r.closed = append(r.closed, o); r.mu.Unlock() }

type env struct {
	lib     *fakeLibrarian
	bus     *fakeBus
	watcher *Watcher
	gov     *Governor
	metrics *recorder
}

func newEnv(t *testing.T, answer func(n int) (int, string)) *env {
	t.Helper()
	e := &env{lib: &fakeLibrarian{answer: answer, statuses: map[string]string{}}, bus: &fakeBus{subs: make(chan struct{}, 16)}, metrics: &recorder{}}
	libSrv := httptest.NewServer(e.lib)
	t.Cleanup(libSrv.Close)
	busSrv := httptest.NewServer(e.bus)
	t.Cleanup(busSrv.Close)
	client := NewClient(func() string { return libSrv.URL }, func(string) string { return "lib_token_0123456789abcdef" }, nil)
	client.Backoff = time.Millisecond
	e.watcher = NewWatcher(WatcherOptions{URL: func() string { return "ws" + strings.TrimPrefix(busSrv.URL, "http") }, ClientID: "test",
		Status: client.Status, BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.watcher.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.gov = NewGovernor(client, e.watcher, e.metrics, nil, nil)
	return e
}

func (e *env) awaitSubscribed(t *testing.T) {
	t.Helper()
	select {
	case <-e.bus.subs:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not subscribe within 10s")
	}
}

func request() *librarianv1.AgentRequest {
	return &librarianv1.AgentRequest{AgentId: "a", RequestType: "APPROVAL", Action: "modify", TargetType: "code", Content: "x", Rationale: "y"}
}

func TestAskOutcomes(t *testing.T) {
	for _, tt := range []struct {
		name          string
		code          int
		status        string
		allowed       bool
		decision      string
		reasonHas     string
		failedClosed  bool
		wantConstrain bool
	}{
		{"approved", 200, "approved", true, Approved, "because", false, true},
		{"rejected", 200, "rejected", false, Rejected, "deviations_and_risk: a deviation", false, false},
		{"clarification", 200, "clarification_needed", false, ClarificationNeeded, "because", false, false},
		{"not registered", 403, "", false, Refused, "not in agents.yaml", true, false},
		{"failing", 503, "", false, Unavailable, "HTTP 503", true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(int) (int, string) { return tt.code, tt.status })
			out := e.gov.Ask(context.Background(), Ask{Request: request(), Key: "k1"})
			if out.Allowed != tt.allowed || out.Decision != tt.decision || !strings.Contains(out.Reason, tt.reasonHas) || out.FailedClosed() != tt.failedClosed {
				t.Fatalf("outcome %+v", out)
			}
			if tt.wantConstrain != (len(out.Constraints) == 1) {
				t.Errorf("constraints %v", out.Constraints)
			}
			if tt.failedClosed && (len(e.metrics.closed) != 1 || e.metrics.closed[0] != tt.decision) {
				t.Errorf("fail-closed metric %v", e.metrics.closed)
			}
			wantCalls := 1
			if tt.code == 503 {
				wantCalls = 3 // retried, under the same key
			}
			if e.lib.calls != wantCalls {
				t.Errorf("%d submissions, want %d", e.lib.calls, wantCalls)
			}
			for _, k := range e.lib.keys {
				if k != "k1" {
					t.Errorf("Idempotency-Key %q", k)
				}
			}
		})
	}
}

func TestLibrarianUnreachable(t *testing.T) {
	client := NewClient(func() string { return "http://127.0.0.1:1" }, nil, nil)
	client.Backoff = time.Millisecond
	rec := &recorder{}
	out := NewGovernor(client, nil, rec, nil, nil).Ask(context.Background(), Ask{Request: request(), Key: "k"})
	if out.Allowed || out.Decision != Unavailable || !strings.Contains(out.Reason, "connection refused") {
		t.Fatalf("outcome %+v", out)
	}
	if len(rec.closed) != 1 {
		t.Errorf("fail-closed metric %v", rec.closed)
	}
}

func TestEscalationDecidedOnTheBus(t *testing.T) {
	e := newEnv(t, func(int) (int, string) { return 200, "escalated" })
	e.awaitSubscribed(t)
	escalated := make(chan Pending, 1)
	done := make(chan Outcome, 1)
	go func() {
		done <- e.gov.Ask(context.Background(), Ask{Request: request(), Key: "k", Escalated: func(_ context.Context, p Pending) { escalated <- p }})
	}()
	var p Pending
	select {
	case p = <-escalated:
	case <-time.After(10 * time.Second):
		t.Fatal("not escalated within 10s")
	}
	if p.RequestID != "req-1" || p.ReviewURL != "http://librarian/review/req-1" || time.Until(p.Deadline) < 23*time.Hour {
		t.Fatalf("pending %+v", p)
	}
	// Another request's decision does not end this wait.
	e.bus.publish(t, decisionEvent("req-2", "approved"))
	e.bus.publish(t, `{"type":"runner.session.update","data":"not a status"}`)
	e.bus.publish(t, decisionEvent("req-1", "approved"))
	select {
	case out := <-done:
		if !out.Allowed || !out.Escalated || !strings.Contains(out.Reason, "alice") {
			t.Fatalf("outcome %+v", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the decision did not end the wait within 10s")
	}
	if len(e.metrics.waited) != 1 || e.metrics.waited[0] != Approved {
		t.Errorf("waited %v", e.metrics.waited)
	}
}

func TestEscalationTimeout(t *testing.T) {
	e := newEnv(t, func(int) (int, string) { return 200, "escalated" })
	e.awaitSubscribed(t)
	out := e.gov.Ask(context.Background(), Ask{Request: request(), Key: "k", MaxWait: 200 * time.Millisecond})
	if out.Allowed || out.Decision != Timeout || !strings.Contains(out.Reason, "no one decided") {
		t.Fatalf("outcome %+v", out)
	}
	if e.lib.reads.Load() == 0 {
		t.Error("the deadline did not read the status once (for the Librarian's own timeout)")
	}
}

// TestDecisionMissedWhileDisconnected: a decision published while the
// watcher's connection is down is found by its status read on reconnect.
func TestDecisionMissedWhileDisconnected(t *testing.T) {
	e := newEnv(t, func(int) (int, string) { return 200, "escalated" })
	e.awaitSubscribed(t)
	done := make(chan Outcome, 1)
	escalated := make(chan struct{})
	go func() {
		done <- e.gov.Ask(context.Background(), Ask{Request: request(), Key: "k", Escalated: func(context.Context, Pending) { close(escalated) }})
	}()
	<-escalated
	e.bus.dropAll()
	e.lib.setStatus("req-1", "rejected")
	select {
	case out := <-done:
		if out.Allowed || out.Decision != Rejected {
			t.Fatalf("outcome %+v", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reconnection's status read did not end the wait within 10s")
	}
}

// TestResumedWait: a wait taken up again (a restart) reads the status
// once, and keeps the deadline it was given.
func TestResumedWait(t *testing.T) {
	e := newEnv(t, func(int) (int, string) { return 200, "escalated" })
	e.lib.setStatus("req-1", "approved")
	out := e.gov.Ask(context.Background(), Ask{Request: request(), Key: "k", Deadline: time.Now().Add(time.Hour)})
	if !out.Allowed {
		t.Fatalf("outcome %+v", out)
	}
}

func TestCancelledWait(t *testing.T) {
	e := newEnv(t, func(int) (int, string) { return 200, "escalated" })
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan Outcome, 1)
	go func() {
		out <- e.gov.Ask(ctx, Ask{Request: request(), Key: "k", Escalated: func(context.Context, Pending) { cancel() }})
	}()
	if o := <-out; o.Allowed || o.Decision != Cancelled {
		t.Fatalf("outcome %+v", o)
	}
}

// TestDecisionBeforeWatch: a decision heard before its waiter registers
// is kept for it.
func TestDecisionBeforeWatch(t *testing.T) {
	w := NewWatcher(WatcherOptions{})
	w.deliver(Decision{RequestID: "r", Status: "approved"})
	wt := w.Watch("r", "a")
	defer wt.Stop()
	select {
	case d := <-wt.C:
		if d.Status != "approved" {
			t.Fatal(d)
		}
	default:
		t.Fatal("the kept decision was not delivered")
	}
}

func TestClientAnswerTooLarge(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"request_id":"x","status":"approved","feedback":"`+strings.Repeat("a", maxAnswerBytes)+`"}`)
	}))
	defer srv.Close()
	c := NewClient(func() string { return srv.URL }, nil, nil)
	c.Attempts = 1
	if _, err := c.Submit(context.Background(), request(), "k"); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("err %v", err)
	}
}

// FuzzDelivery feeds the watcher's handler what a bus (or anyone holding
// a token for it) might send: it must never panic, always ack, and
// deliver only well-formed decisions.
func FuzzDelivery(f *testing.F) {
	f.Add([]byte(`{"topic":"system:librarian.request.approved","payload":` + decisionEvent("r", "approved") + `}`))
	f.Add([]byte(`{"topic":"t","payload":{"data":{"status":"escalated"}}}`))
	f.Add([]byte(`{"payload":{"data":[]}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, params []byte) {
		w := NewWatcher(WatcherOptions{})
		ack, err := w.handleDelivery(context.Background(), &jsonrpc.Request{Method: "sendMessage", Params: params})
		if err != nil || ack == nil {
			t.Fatalf("ack %v err %v", ack, err)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		for id, d := range w.recent {
			if id == "" || !decided(d.Status) {
				t.Fatalf("delivered %+v", d)
			}
		}
	})
}
