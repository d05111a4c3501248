package service_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// TestSilentAgentMidTurn: an ACP agent that accepted session/prompt and
// then sends nothing (examples/acp-agent -mode hang) is found dead by its
// type's silence_timeout (1s), long before its timeout (10m): it is killed
// and the instance failed. The next prompt starts a new process, which
// resumes the session with session/load.
func TestSilentAgentMidTurn(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	r := startRunner(t, nil)
	in := r.Launch(t, "acp-hang-silent", r.workspace(t), map[string]string{"TASK_DESCRIPTION": "think quietly"})
	r.WaitLogWithin(t, in.ID, "acp-agent: hanging on purpose", time.Minute)
	r.WaitLogWithin(t, in.ID, "status: failed (dead protocol: no message from the agent for 1s mid-turn)", time.Minute)
	r.WaitLogWithin(t, in.ID, "launch 1 ended (dead_protocol", time.Minute)
	first := r.Status(t, in.ID)
	if first.Status != "failed" || first.ContainerID == "" {
		t.Fatalf("after the silence: %+v", first)
	}
	if runnertest.HasLog(r.Logs(t, in.ID), "loaded session") {
		t.Fatal("the first launch loaded a session")
	}

	var ok struct{ Accepted bool }
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "again"}, &ok); code != http.StatusOK || !ok.Accepted {
		t.Fatalf("prompt after the dead protocol: HTTP %d", code)
	}
	r.WaitLogWithin(t, in.ID, "acp-agent: loaded session", time.Minute)
	// The new process hangs too, and is found dead the same way.
	r.WaitLogWithin(t, in.ID, "launch 2 ended (dead_protocol", time.Minute)
	second := r.Status(t, in.ID)
	if second.Status != "failed" || second.ContainerID == first.ContainerID {
		t.Fatalf("the resumed launch: %+v (the first process was %s)", second, first.ContainerID)
	}
	if n := countLogs(r.Logs(t, in.ID), "started acp-hang-silent"); n != 2 {
		t.Errorf("%d processes started, want 2", n)
	}
}
