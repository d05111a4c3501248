package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

var (
	runnerBinOnce sync.Once
	runnerBin     string
	runnerBinErr  error
)

// runnerBinary builds services/runner/cmd/runner once, beside conclaveBin
// in the directory TestMain removes at the end (a directory of its own
// was left behind, 55 MB a run).
func runnerBinary(t *testing.T) string {
	t.Helper()
	runnerBinOnce.Do(func() {
		runnerBin = filepath.Join(filepath.Dir(conclaveBin), "runner")
		runnerBinErr = testenv.GoBuild(t.Context(), runnerBin, "./services/runner/cmd/runner")
	})
	if runnerBinErr != nil {
		t.Fatal(runnerBinErr)
	}
	return runnerBin
}

// startRunnerProcess runs cmd/runner on e's Librarian, bus and storage,
// its REST API on port.
func (e *governedEnv) startRunnerProcess(t *testing.T, port string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(runnerBinary(t))
	cmd.Env = append(os.Environ(), "CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT="+e.storage.AWSEndpoint, "CONCLAVE_TABLE_PREFIX=governed-")
	for k, v := range e.runnerEnv() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "CONCLAVE_RUNNER_HTTP_ADDR=127.0.0.1:"+port)
	if testing.Verbose() {
		cmd.Stderr = testWriter{t}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	e.runnerURL = "http://127.0.0.1:" + port
	testenv.EventuallyNoError(t, time.Minute, "the runner to be ready", func() error {
		resp, err := http.Get(e.runnerURL + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: HTTP %d", resp.StatusCode)
		}
		return nil
	})
	return cmd
}

// kill9 kills the runner process with SIGKILL and waits for it.
func kill9(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// TestGovernedRunnerKilledMidWait: a runner killed with SIGKILL while its
// agent's turn waits for a person takes the wait up again when it comes
// back (the same Librarian request, awaiting_approval again); killed
// again, the person decides while it is down, and the runner that comes
// back applies that decision: the agent goes on. The Librarian holds one
// request for the turn, never two.
func TestGovernedRunnerKilledMidWait(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the Librarian, the bus, cmd/runner and node on dynalite and fauxqs")
	}
	t.Parallel()
	e := startGoverned(t, governedOptions{aws: true, protocol: escalateDeviation, runnerProcess: true})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(testenv.As[*net.TCPAddr](t, l.Addr(), "the listener's address").Port)
	l.Close()

	first := e.startRunnerProcess(t, port)
	in := e.launch(t, "task-governed-killed")
	waiting := e.waitStatus(t, in.ID, 3*time.Minute, "awaiting_approval", "completed", "failed")
	if waiting.Status != "awaiting_approval" {
		t.Fatalf("status %+v; log:\n%s", waiting, e.logText(t, in.ID))
	}
	requestID := path.Base(waiting.ReviewURL)
	kill9(t, first)

	// Back: the turn runs again, its agent asks again, and the wait is
	// taken up with the same request.
	second := e.startRunnerProcess(t, port)
	e.waitLog(t, in.ID, "launch 1", time.Minute)
	testenv.EventuallyNoError(t, 3*time.Minute, "the second runner to take the wait up", func() error {
		// (What the killed runner had not yet flushed of its log is lost.)
		log := e.logText(t, in.ID)
		if i := strings.LastIndex(log, "started "+governedType); strings.Count(log, "started "+governedType) < 2 || !strings.Contains(log[i:], "escalated to a person") {
			return fmt.Errorf("log:\n%s", log)
		}
		return nil
	})
	again := e.waitStatus(t, in.ID, time.Minute, "awaiting_approval")
	if path.Base(again.ReviewURL) != requestID {
		t.Fatalf("the wait was taken up with another request: %s, first %s", again.ReviewURL, waiting.ReviewURL)
	}
	kill9(t, second)

	// Decided while no runner runs.
	e.decide(t, requestID, "approve", "Approved while the runner was down.")
	e.startRunnerProcess(t, port)
	done := e.waitStatus(t, in.ID, 3*time.Minute, "completed", "failed", "stopped")
	log := e.logText(t, in.ID)
	if done.Status != "completed" || !strings.Contains(log, agentAllowed) || !strings.Contains(log, `": approved`) {
		t.Fatalf("status %+v; log:\n%s", done, log)
	}
	var decidedList struct {
		Requests []struct {
			RequestID string `json:"request_id"`
			AgentID   string `json:"agent_id"`
			Decision  string `json:"decision"`
			DecidedBy string `json:"decided_by"`
		} `json:"requests"`
	}
	call(t, "GET", e.librarianURL+"/reviews?status=decided", reviewerLibToken, nil, &decidedList)
	var ours []string
	for _, r := range decidedList.Requests {
		if r.AgentID == governedType {
			ours = append(ours, fmt.Sprintf("%s %s by %s", r.RequestID, r.Decision, r.DecidedBy))
		}
	}
	if len(ours) != 1 || ours[0] != requestID+" approved by reviewer" {
		t.Fatalf("the Librarian's decided requests of %s: %v, want only %s approved by reviewer", governedType, ours, requestID)
	}
	var waitingList struct {
		Requests []any `json:"requests"`
	}
	call(t, "GET", e.librarianURL+"/reviews?status=escalated", reviewerLibToken, nil, &waitingList)
	if len(waitingList.Requests) != 0 {
		t.Fatalf("requests still escalated: %v", waitingList.Requests)
	}
}
