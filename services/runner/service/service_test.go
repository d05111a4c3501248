package service_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

func TestDialects(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	for _, tt := range []struct {
		agentType, dialect string
		wantLog            string
		writesNotes        bool
	}{
		{"acp-normal", "acp", "content: Working on: fix the bug", true},
		{"kandev-normal", "kandev", "content: Working on: fix the bug", false},
		{"legacy-normal", "legacy", "complete: legacy run done", false},
		{"acp-junk", "acp", "content: Working on: fix the bug", true},
	} {
		t.Run(tt.agentType, func(t *testing.T) {
			t.Parallel()
			ws := r.workspace(t)
			in := r.Launch(t, tt.agentType, ws, map[string]string{"TASK_DESCRIPTION": "fix the bug"})
			if in.Status != "starting" || in.ID == "" || in.StartedAt == "" || in.AgentType != tt.agentType {
				t.Fatalf("launch returned %+v", in)
			}
			done := r.WaitStatus(t, in.ID, "completed", "failed", "stopped")
			if done.Status != "completed" || done.Progress != 100 || done.FinishedAt == "" || done.ContainerID == "" {
				t.Fatalf("final status %+v; logs %+v", done, r.Logs(t, in.ID))
			}
			// Logs are stored in batches, shortly after.
			r.WaitLog(t, in.ID, tt.wantLog)
			r.WaitLog(t, in.ID, "acp-agent: dialect")
			if tt.writesNotes {
				data, err := os.ReadFile(filepath.Join(ws, "notes.txt"))
				if err != nil || !strings.Contains(string(data), "fix the bug") {
					t.Errorf("fs/write_text_file did not write notes.txt: %q %v", data, err)
				}
			}
			if tt.dialect != "legacy" {
				var sess struct {
					SessionID string `json:"session_id"`
					TaskID    string `json:"task_id"`
				}
				r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/session", nil, &sess)
				if sess.SessionID == "" || sess.TaskID != in.TaskID {
					t.Errorf("session %+v", sess)
				}
				var task struct {
					ID       string         `json:"id"`
					Metadata map[string]any `json:"metadata"`
				}
				r.Do(t, "GET", "/api/v1/tasks/"+in.TaskID, nil, &task)
				if task.Metadata["session_id"] != sess.SessionID || task.Metadata["origin"] != "test" {
					t.Errorf("task metadata %+v, want session_id %s", task.Metadata, sess.SessionID)
				}
			}
		})
	}
}

func TestPromptResumesSession(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	// With no idle time, the agent stops after each turn, so a prompt
	// resumes the session in a new process through session/load.
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_IDLE_TIMEOUT": "1ms"})
	in := r.Launch(t, "acp-normal", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "first"})
	r.WaitStatus(t, in.ID, "completed")
	r.WaitLog(t, in.ID, "idle for")
	var ok struct {
		Accepted bool `json:"accepted"`
	}
	// The launch may still be winding down; a prompt is refused until then.
	for code := 0; code != http.StatusOK; {
		code = r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "second"}, &ok)
	}
	r.WaitLog(t, in.ID, "Working on: second")
	r.WaitStatus(t, in.ID, "completed")
	if !runnertest.HasLog(r.Logs(t, in.ID), "acp-agent: loaded session") {
		t.Errorf("the session was not resumed with session/load: %+v", r.Logs(t, in.ID))
	}
}

func TestFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	for _, tt := range []struct {
		agentType, want, errPart string
	}{
		{"acp-crash", "failed", ""},
		{"kandev-crash", "failed", ""},
		{"acp-hang-init", "failed", "dead protocol: no answer to initialize"},
		{"kandev-hang", "failed", "dead protocol: no answer to session/prompt"},
		{"acp-hang", "failed", "timed out after 20s"},
	} {
		t.Run(tt.agentType, func(t *testing.T) {
			t.Parallel()
			in := r.Launch(t, tt.agentType, r.workspace(t), map[string]string{"TASK_DESCRIPTION": "x"})
			done := r.WaitStatus(t, in.ID, "completed", "failed", "stopped")
			if done.Status != tt.want {
				t.Fatalf("status %s, want %s; logs %+v", done.Status, tt.want, r.Logs(t, in.ID))
			}
			if tt.errPart != "" {
				r.WaitLog(t, in.ID, tt.errPart)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	t.Run("during a tool call, the agent goes on", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "acp-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "slow"})
		r.WaitLog(t, in.ID, "tool_call write notes.txt")
		var c struct {
			ID, Status string
		}
		if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "user asked"}, &c); code != http.StatusOK {
			t.Fatalf("cancel: HTTP %d", code)
		}
		done := r.WaitStatus(t, in.ID, "stopped", "failed", "completed")
		if done.Status != "stopped" {
			t.Fatalf("status %+v", done)
		}
		// Not killed: the same process takes the next prompt.
		var ok struct{ Accepted bool }
		if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "again"}, &ok); code != http.StatusOK || !ok.Accepted {
			t.Fatalf("prompt after cancel: HTTP %d %+v", code, ok)
		}
		r.WaitLog(t, in.ID, "Working on: again")
		if after := r.Status(t, in.ID); after.ContainerID != done.ContainerID {
			t.Errorf("the process changed: %s then %s", done.ContainerID, after.ContainerID)
		}
		if code := r.Do(t, "DELETE", "/api/v1/agents/"+in.ID, nil, nil); code != http.StatusOK {
			t.Fatalf("delete: HTTP %d", code)
		}
		var e errorBody
		if code := r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/status", nil, &e); code != http.StatusNotFound || e.Error != "not_found" {
			t.Errorf("status after delete: %d %+v", code, e)
		}
	})
	t.Run("ignored, the agent is killed after the grace", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "acp-ignore-cancel", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "slow"})
		r.WaitLog(t, in.ID, "tool_call write notes.txt")
		r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "user asked"}, nil)
		done := r.WaitStatus(t, in.ID, "stopped", "failed", "completed")
		if done.Status != "stopped" {
			t.Fatalf("status %+v", done)
		}
		r.WaitLog(t, in.ID, "ignored session/cancel")
	})
	t.Run("kandev agents exit on cancel", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "kandev-slow-tool", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "slow"})
		r.WaitLog(t, in.ID, "tool_call file_edit")
		r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]string{"reason": "user asked"}, nil)
		if done := r.WaitStatus(t, in.ID, "stopped", "failed", "completed"); done.Status != "stopped" {
			t.Fatalf("status %+v", done)
		}
	})
}

// TestDeadProtocolReplacedOnResume: a live agent that never answers
// initialize is killed and the instance failed; a prompt then starts a new
// process, which works.
func TestDeadProtocolReplacedOnResume(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT": "2s"})
	in := r.Launch(t, "acp-hang-init-once", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "first"})
	failed := r.WaitStatus(t, in.ID, "failed", "completed")
	if failed.Status != "failed" {
		t.Fatalf("status %+v", failed)
	}
	r.WaitLog(t, in.ID, "dead protocol: no answer to initialize within 2s")
	// The launch is over once its process is: the instance names it.
	for failed.ContainerID == "" {
		failed = r.Status(t, in.ID)
	}
	var ok struct{ Accepted bool }
	for code := 0; code != http.StatusOK; {
		code = r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "second"}, &ok)
	}
	r.WaitLog(t, in.ID, "Working on: second")
	done := r.WaitStatus(t, in.ID, "completed", "failed")
	if done.Status != "completed" || done.ContainerID == failed.ContainerID {
		t.Fatalf("after the prompt: %+v (the dead process was %s)", done, failed.ContainerID)
	}
}
