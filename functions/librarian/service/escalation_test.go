package service_test

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/functions/librarian/service"
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
	req := seedApproval()
	req["target_path"] = path
	req["risk_assessment"] = "high: changes the authentication flow"
	resp := e.do(t, "POST", "/agent/request", claudeToken, req).response(t)
	if resp.Status != "escalated" {
		t.Fatalf("not escalated: %v", resp)
	}
	return resp
}

// An escalated request no reviewer decides within timeouts.escalation (24
// hours as the seed configures it) is rejected: on the agent's next status
// poll, in the review list and on a late decision, which gets 409.
func TestEscalationTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		mod      func(t *testing.T, c *service.Config)
		deadline time.Duration
	}{
		{"seed default", nil, 24 * time.Hour},
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
