package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// TestPermissionsLoggedAndPublished: every session/request_permission an
// agent sends, and how the type's policy answered it, is in the
// instance's log and on the events queue (the task's topic), under each
// policy.
func TestPermissionsLoggedAndPublished(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	for _, tt := range []struct {
		agentType, answer, toolStatus string
	}{
		{"acp-normal", "selected allow [allow_once] (policy allow)", "completed"},
		{"acp-deny", "selected reject [reject_once] (policy deny)", "failed"},
	} {
		t.Run(tt.agentType, func(t *testing.T) {
			t.Parallel()
			r := startRunner(t, nil)
			in := r.Launch(t, tt.agentType, r.workspace(t), map[string]string{"TASK_DESCRIPTION": "take notes"})
			if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
				t.Fatalf("status %+v; logs %+v", st, r.Logs(t, in.ID))
			}
			r.WaitLogWithin(t, in.ID, "permission_request write notes.txt: options allow [allow_once], reject [reject_once]", time.Minute)
			r.WaitLogWithin(t, in.ID, "permission_outcome write notes.txt [selected]: "+tt.answer, time.Minute)
			r.WaitLogWithin(t, in.ID, "tool_call_update call_1 ["+tt.toolStatus+"]", time.Minute)
			events := waitUpdateEvents(t, r, in.ID, "permission_outcome", tt.answer)
			var asked bool
			for _, e := range events {
				if e.Kind == "permission_request" && strings.Contains(e.Update, `"toolCallId":"call_1"`) && strings.Contains(e.Text, "allow [allow_once]") {
					asked = true
				}
			}
			if !asked {
				t.Errorf("no permission_request event with the request; got %+v", events)
			}
		})
	}
}

// TestAgentErrorsAndAuthenticate: an agent that offers authMethods and
// opens no session until authenticate is called. A type naming the
// method is authenticated before session/new; a type naming none fails
// with the agent's own error, labelled as the agent's and saying which
// methods it offers (it was a "dead_protocol"); a type naming a method
// the agent does not offer fails without asking it.
func TestAgentErrorsAndAuthenticate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	for _, tt := range []struct {
		agentType, status string
		logs              []string
	}{
		{"acp-auth", "completed", []string{
			"authenticated with the agent's auth method test-key",
			"acp-agent: authenticated with test-key",
			"Working on: take notes",
		}},
		{"acp-auth-none", "failed", []string{
			"status: failed (session/new: the agent answered with an error: Authentication required: no API key is configured (code -32000); the agent offers authMethods test-key (Test key), and the agent type names none in auth_method)",
			"launch 1 ended (agent_error: session/new: the agent answered with an error: Authentication required",
		}},
		{"acp-auth-other", "failed", []string{
			`launch 1 ended (bad_type: the agent type's auth_method "other-key" is not one the agent offers; it offers test-key (Test key))`,
		}},
	} {
		t.Run(tt.agentType, func(t *testing.T) {
			t.Parallel()
			in := r.Launch(t, tt.agentType, r.workspace(t), map[string]string{"TASK_DESCRIPTION": "take notes"})
			if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != tt.status {
				t.Fatalf("status %+v, want %s; logs %+v", st, tt.status, r.Logs(t, in.ID))
			}
			for _, want := range tt.logs {
				r.WaitLogWithin(t, in.ID, want, time.Minute)
			}
			if lines := r.Logs(t, in.ID); runnertest.HasLog(lines, "dead protocol") || runnertest.HasLog(lines, "dead_protocol") {
				t.Errorf("labelled a dead protocol: %+v", lines)
			}
		})
	}
	t.Run("the status and its event carry the agent's error", func(t *testing.T) {
		// Alone on the events queue: every other instance has ended.
		r := startRunner(t, nil)
		in := r.Launch(t, "acp-auth-none", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "take notes"})
		// The status says why, as the event does.
		if st := r.WaitStatus(t, in.ID, "failed"); !strings.Contains(st.Error, "Authentication required: no API key is configured") {
			t.Errorf("the failed instance's status says %q, want the agent's error", st.Error)
		}
		var failed *statusEvent
		testenv.Eventually(t, time.Minute, "the failed status event", func() bool {
			for _, e := range drainStatusEvents(t, r.q, r.cfg.EventsQueue, in.ID) {
				if e.Status == "failed" {
					failed = &e
				}
			}
			return failed != nil
		})
		if !strings.Contains(failed.Error, "Authentication required: no API key is configured") {
			t.Fatalf("the failed event's error is %q", failed.Error)
		}
	})
}
