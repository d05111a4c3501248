package service_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// TestLaunchResumesStoredSession: a new instance launched with the session
// id a finished task stored (GET /api/v1/tasks/{id}) resumes that session
// in a real agent (examples/acp-agent) with session/load instead of
// session/new: given as metadata.session_id (ACP), or Kandev's way, as
// env AUGGIE_SESSION_ID from the task's metadata.auggie_session_id
// (kandev).
func TestLaunchResumesStoredSession(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "300ms"})
	for _, tt := range []struct {
		name, agentType string
		// resume is the launch that names the session: its metadata and
		// env.
		resume func(sessionID string) (metadata map[string]any, env map[string]string)
		key    string // where the task's metadata has the session id
	}{
		{"metadata.session_id", "acp-normal", func(id string) (map[string]any, map[string]string) {
			return map[string]any{"session_id": id}, map[string]string{"TASK_DESCRIPTION": "what did you do?"}
		}, "session_id"},
		{"env AUGGIE_SESSION_ID", "kandev-normal", func(id string) (map[string]any, map[string]string) {
			return map[string]any{}, map[string]string{"AUGGIE_SESSION_ID": id, "TASK_DESCRIPTION": "what did you do?"}
		}, "auggie_session_id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ws := r.workspace(t)
			first := r.Launch(t, tt.agentType, ws, map[string]string{"TASK_DESCRIPTION": "first task"})
			if done := r.WaitStatus(t, first.ID, "completed", "failed"); done.Status != "completed" {
				t.Fatalf("the first task: %+v", done)
			}
			var task struct {
				Metadata map[string]any `json:"metadata"`
			}
			var sessionID string
			testenv.EventuallyNoError(t, time.Minute, "the task's "+tt.key, func() error {
				r.Do(t, "GET", "/api/v1/tasks/"+first.TaskID, nil, &task)
				if sessionID, _ = task.Metadata[tt.key].(string); sessionID == "" {
					return fmt.Errorf("its metadata %+v", task.Metadata)
				}
				return nil
			})
			if runnertest.HasLog(r.Logs(t, first.ID), "loaded session") {
				t.Fatal("the first launch loaded a session")
			}

			metadata, env := tt.resume(sessionID)
			var second instance
			if code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
				"task_id": first.TaskID + "-followup", "agent_type": tt.agentType, "workspace_path": ws, "env": env, "metadata": metadata,
			}, &second); code != http.StatusOK {
				t.Fatalf("the follow-up launch: HTTP %d", code)
			}
			if done := r.WaitStatus(t, second.ID, "completed", "failed"); done.Status != "completed" {
				t.Fatalf("the follow-up task: %+v; logs %+v", done, r.Logs(t, second.ID))
			}
			r.WaitLogWithin(t, second.ID, "acp-agent: loaded session "+sessionID, time.Minute)
			r.WaitLogWithin(t, second.ID, "Working on: what did you do?", time.Minute)
			var sess struct {
				SessionID string `json:"session_id"`
			}
			r.Do(t, "GET", "/api/v1/agents/"+second.ID+"/session", nil, &sess)
			if sess.SessionID != sessionID {
				t.Errorf("the follow-up's session is %q, want the stored %q", sess.SessionID, sessionID)
			}
		})
	}
}
