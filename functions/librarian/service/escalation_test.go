package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// fakeClock is a clock the test moves.
type fakeClock struct{ at atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.at.Store(time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.at.Load()).UTC() }
func (c *fakeClock) advance(d time.Duration) { c.at.Add(int64(d)) }

func (e *env) requestStatus(t *testing.T, id string) *librarianv1.RequestStatus {
	t.Helper()
	r := e.do(t, "GET", "/agent/status/"+id, claudeToken, nil)
	var st librarianv1.RequestStatus
	if err := protojson.Unmarshal(r.body, &st); err != nil || r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	return &st
}

func escalate(t *testing.T, e *env, path string) *librarianv1.LibrarianResponse {
	t.Helper()
	req := librarianApproval()
	req["target_path"] = path
	req["risk_assessment"] = "high: changes the authentication flow"
	resp := e.do(t, "POST", "/agent/request", claudeToken, req).response(t)
	if resp.Status != "escalated" {
		t.Fatalf("not escalated: %v", resp)
	}
	return resp
}

// An escalated request no reviewer decides within timeouts.escalation (24
// hours as the protocol configures it) is rejected: on the agent's next status
// poll, in the review list and on a late decision, which gets 409.
func TestEscalationTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		mod      func(t *testing.T, c *service.Config)
		deadline time.Duration
	}{
		{"protocol default", nil, 24 * time.Hour},
		{"configured", func(t *testing.T, c *service.Config) {
			c.ConfigDir = t.TempDir()
			writeConfig(t, c.ConfigDir, "escalation: 86400000ms", "escalation: 60000ms")
		}, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			e := newEnvAt(t, func(c *service.Config) {
				if tt.mod != nil {
					tt.mod(t, c)
				}
			}, clock.now)
			polled := escalate(t, e, "docs/design/polled.md")
			decided := escalate(t, e, "docs/design/decided-late.md")
			if got := polled.GetEstimatedReviewTime(); got != int32(tt.deadline/time.Minute) {
				t.Errorf("estimated_review_time = %d, want %d", got, tt.deadline/time.Minute)
			}
			e.events(t)

			clock.advance(tt.deadline - time.Second)
			if st := e.requestStatus(t, polled.RequestId); st.Status != "escalated" {
				t.Fatalf("before the deadline: %v", st)
			}
			if list := e.do(t, "GET", "/reviews?status=escalated", reviewerToken, nil); !strings.Contains(string(list.body), decided.RequestId) {
				t.Fatalf("before the deadline the review list lacks the request: %s", list.body)
			}

			clock.advance(time.Second)
			st := e.requestStatus(t, polled.RequestId)
			if st.Status != "rejected" || !slices.ContainsFunc(st.Response.GetViolations(), func(v *librarianv1.ViolationDetail) bool { return v.Rule == "escalation_timeout" }) ||
				!strings.Contains(st.Response.GetFeedback(), "timeouts.escalation") {
				t.Fatalf("after the deadline: %v", st)
			}
			if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.rejected"}) {
				t.Errorf("events of the expiry %v", got)
			}

			late := e.do(t, "POST", "/reviews/"+decided.RequestId+"/decision", reviewerToken, map[string]any{"decision": "approve", "comment": "Looks fine."})
			if late.status != 409 || late.errorCode(t) != "escalation_expired" {
				t.Fatalf("a decision after the deadline: %d %s", late.status, late.body)
			}
			if st := e.requestStatus(t, decided.RequestId); st.Status != "rejected" {
				t.Fatalf("a late-decided request: %v", st)
			}
			if list := e.do(t, "GET", "/reviews?status=escalated", reviewerToken, nil); strings.Contains(string(list.body), "req-") {
				t.Fatalf("expired requests still wait for review: %s", list.body)
			}
			// Each expiry is one event, however often it is read.
			if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.rejected"}) {
				t.Errorf("events of the late decision %v", got)
			}
		})
	}
}

// The sweep rejects an overdue escalation nobody reads, once, with its
// event; one still within its deadline waits. The local server runs it
// every SweepInterval.
func TestEscalationSweep(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	e := newEnvAt(t, nil, clock.now)
	first := escalate(t, e, "docs/design/first.md")
	clock.advance(time.Hour)
	second := escalate(t, e, "docs/design/second.md")
	e.events(t)

	clock.advance(24*time.Hour - time.Hour)
	ctx := context.Background()
	if n, err := e.lib.SweepEscalations(ctx); err != nil || n != 1 {
		t.Fatalf("sweep at the first deadline: %d, %v; want 1 rejected", n, err)
	}
	envs := e.events(t)
	if got := types(envs); !slices.Equal(got, []string{"librarian.request.rejected"}) || envs[0].GetSubjectIds()["request_id"] != first.RequestId {
		t.Fatalf("events of the sweep %v", envs)
	}
	if n, err := e.lib.SweepEscalations(ctx); err != nil || n != 0 {
		t.Fatalf("a second sweep: %d, %v; want none rejected", n, err)
	}
	if got := e.events(t); len(got) != 0 {
		t.Fatalf("a second sweep emitted %v", types(got))
	}
	if st := e.requestStatus(t, second.RequestId); st.Status != "escalated" {
		t.Fatalf("the request within its deadline: %v", st)
	}
	if st := e.requestStatus(t, first.RequestId); st.Status != "rejected" {
		t.Fatalf("the swept request: %v", st)
	}
}

// TestSweepLoop: service.New sweeps on its own while it runs.
func TestSweepLoop(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queue.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	if err := q.Ensure(ctx, service.EventsQueue); err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(service.Config{HTTPAddr: "127.0.0.1:0", APIRate: "60/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second,
		SweepInterval: 10 * time.Millisecond, AgentTokens: []string{"claude-3=" + claudeToken}},
		service.Deps{Store: st, Queue: q, Now: clock.now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []graph.Node{{ID: "arch-001", Type: "architecture", Title: "Architecture overview"}, {ID: "req-045", Type: "docs", Title: "Requirements"}} {
		if err := graph.New(st).Put(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-svc.Ready()
	e := &env{srv: &httptest.Server{URL: "http://" + svc.Endpoints()[0].Address}, st: st, queue: q}
	escalated := escalate(t, e, "docs/design/unread.md")
	e.events(t)
	clock.advance(24 * time.Hour)
	for {
		envs := e.events(t)
		if slices.ContainsFunc(envs, func(env *eventsv1.Envelope) bool {
			return env.Type == "librarian.request.rejected" && env.GetSubjectIds()["request_id"] == escalated.RequestId
		}) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the running service never rejected the overdue escalation; events %v", types(envs))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestDecisionEventInTheRequestsTrace: a reviewer's decision, made in a
// trace of its own, is sent in the trace the request was submitted in, so
// that it reaches the waiting agent (a runner's governed turn) in the
// agent's trace.
func TestDecisionEventInTheRequestsTrace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "librarian-test"})
	if err != nil {
		t.Fatal(err)
	}
	traced := httptest.NewServer(tel.HTTPHandler(e.lib.Handler, "librarian"))
	t.Cleanup(traced.Close)
	send := func(path, token, traceparent string, body any) reply {
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", traced.URL+path, bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", traceparent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{status: resp.StatusCode, body: b}
	}
	const agentTrace, reviewerTrace = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736"
	req := librarianApproval()
	req["risk_assessment"] = "high: changes the authentication flow"
	resp := send("/agent/request", claudeToken, "00-"+agentTrace+"-b7ad6b7169203331-01", req).response(t)
	if resp.Status != "escalated" {
		t.Fatalf("not escalated: %v", resp)
	}
	e.events(t)
	if r := send("/reviews/"+resp.RequestId+"/decision", reviewerToken, "00-"+reviewerTrace+"-00f067aa0ba902b7-01",
		map[string]any{"decision": "approve", "comment": "fine"}); r.status != 200 {
		t.Fatalf("decision: %d %s", r.status, r.body)
	}
	msgs, err := e.queue.Receive(context.Background(), service.EventsQueue.Name, queue.ReceiveOptions{Max: 10})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("messages %v, %v", msgs, err)
	}
	env := &eventsv1.Envelope{}
	if err := protojson.Unmarshal(msgs[0].Body, env); err != nil || env.Type != "librarian.request.approved" {
		t.Fatalf("event %v, %v", env, err)
	}
	// Both the envelope and the message (whose attribute the bus reads
	// first) carry the request's trace.
	if tp := env.GetTraceContext().GetTraceparent(); !strings.Contains(tp, agentTrace) {
		t.Fatalf("the decision event's traceparent %q is not in the request's trace %s", tp, agentTrace)
	}
	if tp := msgs[0].Attributes["traceparent"]; !strings.Contains(tp, agentTrace) {
		t.Fatalf("the decision event's message has traceparent %q, not in the request's trace %s", tp, agentTrace)
	}
}
