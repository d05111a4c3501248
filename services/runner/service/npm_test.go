package service_test

import (
	"net/http"
	"testing"
)

// TestNPMExampleAgent drives the example agent shipped in
// @agentclientprotocol/sdk (pinned in package-lock.json), a third-party ACP
// implementation: initialize, session/new, a prompt whose updates include a
// tool call and a permission request, end_turn; then a second prompt in the
// same process, cancelled mid-turn, and a third that still works.
func TestNPMExampleAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node")
	}
	t.Parallel()
	r := startRunner(t, nil)
	in := r.Launch(t, "npm-example", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "improve the config"})
	done := r.WaitStatus(t, in.ID, "completed", "failed", "stopped")
	if done.Status != "completed" {
		t.Fatalf("status %+v; logs %+v", done, r.Logs(t, in.ID))
	}
	for _, want := range []string{
		"content: I'll help you with that",
		"tool_call Reading project files [pending]",
		"tool_call_update call_1 [completed]",
		// Our permission policy (allow) picked "allow": the agent says so.
		"I've successfully updated the configuration",
	} {
		r.WaitLog(t, in.ID, want)
	}
	var sess struct {
		SessionID string `json:"session_id"`
	}
	r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/session", nil, &sess)
	if len(sess.SessionID) != 32 {
		t.Errorf("session id %q", sess.SessionID)
	}

	// Cancel: the turn ends with stopReason cancelled, the process lives.
	var ok struct{ Accepted bool }
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "again"}, &ok); code != http.StatusOK {
		t.Fatalf("prompt: HTTP %d", code)
	}
	r.WaitStatus(t, in.ID, "running")
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "changed my mind"}, nil); code != http.StatusOK {
		t.Fatalf("cancel: HTTP %d", code)
	}
	stopped := r.WaitStatus(t, in.ID, "stopped", "failed", "completed")
	if stopped.Status != "stopped" || stopped.ContainerID != done.ContainerID {
		t.Fatalf("after cancel %+v (process was %s)", stopped, done.ContainerID)
	}
	for code := 0; code != http.StatusOK; {
		code = r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "third"}, &ok)
	}
	if final := r.WaitStatus(t, in.ID, "completed", "failed"); final.Status != "completed" || final.ContainerID != done.ContainerID {
		t.Fatalf("third turn %+v", final)
	}
}
