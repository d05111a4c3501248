package service_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/pkg/testenv"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/api"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// grpcAddr is the runner's gRPC listener.
func (r *testRunner) grpcAddr(t *testing.T) string {
	t.Helper()
	for _, e := range r.Endpoints() {
		if strings.HasPrefix(e.Protocol, "gRPC") {
			return e.Address
		}
	}
	t.Fatal("the runner has no gRPC endpoint")
	return ""
}

// processGone reports whether the agent process of a local container id
// no longer exists.
func processGone(t *testing.T, containerID string) bool {
	t.Helper()
	pid, err := strconv.Atoi(containerID)
	if err != nil || pid <= 0 {
		t.Fatalf("container id %q is not a pid", containerID)
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// TestReplicasForward: requests for instances whose agents runner A runs,
// made of runner B (same store and queue, listeners of its own), reach A's
// agents: a prompt to an idle session runs in the same process, a cancel
// stops the turn without killing the agent, a follow sees lines as the
// agent logs them, a delete kills the agent. A call marked as forwarded is
// not forwarded again. Tokens are required: the caller's goes with the
// forwarded call.
func TestReplicasForward(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	const token = "replica-test-token"
	cfg, st, q := sharedState(t, map[string]string{"CONCLAVE_RUNNER_CLIENT_TOKENS": token, "CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "false"})
	a, _ := runOn(t, cfg, st, q, nil)
	a.Token = token
	idle := a.Launch(t, "acp-normal", a.workspace(t), map[string]string{"TASK_DESCRIPTION": "first"})
	firstTurn := a.WaitStatus(t, idle.ID, "completed", "failed", "stopped")
	if firstTurn.Status != "completed" {
		t.Fatalf("the first turn: %+v", firstTurn)
	}
	slow := a.Launch(t, "acp-slow-tool", a.workspace(t), map[string]string{"TASK_DESCRIPTION": "long"})
	a.WaitLog(t, slow.ID, "tool_call write notes.txt")
	slowOnA := a.Status(t, slow.ID)
	// Started once both launches are claimed by A: B's workers find the
	// queue empty.
	b, _ := runOn(t, cfg, st, q, nil)
	b.Token = token
	forwardedCancels := func() float64 {
		return metricstest.Scrape(t, b.Base+"/metrics").Value("conclave_runner_forwarded_requests_total", "method", "cancel", "outcome", "ok")
	}

	t.Run("prompt", func(t *testing.T) {
		b.prompt(t, idle.ID, "second")
		a.WaitLog(t, idle.ID, "Working on: second")
		if st := b.WaitStatus(t, idle.ID, "completed", "failed", "stopped"); st.Status != "completed" || st.ContainerID != firstTurn.ContainerID {
			t.Fatalf("the second turn: %+v, want completed in container %s", st, firstTurn.ContainerID)
		}
		if n := countLogs(b.Logs(t, idle.ID), "started acp-normal"); n != 1 {
			t.Errorf("the agent started %d times, want 1", n)
		}
	})

	t.Run("loop guard", func(t *testing.T) {
		conn, err := grpc.NewClient(b.grpcAddr(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		client := runnerv1.NewRunnerServiceClient(conn)
		before := forwardedCancels()
		ctx := metadata.AppendToOutgoingContext(context.Background(), api.ForwardedKey, "1", "authorization", "Bearer "+token)
		_, err = client.CancelAgent(ctx, &runnerv1.CancelAgentRequest{InstanceId: slow.ID, Reason: "looped"})
		st := status.Convert(err)
		var reason string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.GetReason()
			}
		}
		if st.Code() != codes.Unavailable || reason != api.CodeUnavailable {
			t.Fatalf("a forwarded cancel on a replica not running the agent: %v (reason %q), want UNAVAILABLE %q", err, reason, api.CodeUnavailable)
		}
		if after := forwardedCancels(); after != before {
			t.Errorf("the forwarded cancel was forwarded again: forwarded cancels %v → %v", before, after)
		}
		if runnertest.HasLog(a.Logs(t, slow.ID), "looped") {
			t.Error("the forwarded cancel reached the agent")
		}
		if st := b.Status(t, slow.ID); st.Status != "running" {
			t.Errorf("after the forwarded cancel: %+v", st)
		}
	})

	lines := b.Follow(t, slow.ID, 5)
	t.Run("follow and cancel", func(t *testing.T) {
		runnertest.AwaitLine(t, lines, "tool_call write notes.txt", runnertest.DefaultWaitTimeout)
		before := forwardedCancels()
		var out struct{ ID, Status string }
		if code := b.Do(t, "POST", "/api/v1/agents/"+slow.ID+"/cancel", map[string]string{"reason": "asked of b"}, &out); code != http.StatusOK || out.ID != slow.ID {
			t.Fatalf("cancel via b: HTTP %d %+v", code, out)
		}
		if after := forwardedCancels(); after != before+1 {
			t.Errorf("forwarded cancels %v → %v, want one more", before, after)
		}
		runnertest.AwaitLine(t, lines, "cancel requested: asked of b", runnertest.DefaultWaitTimeout)
		runnertest.AwaitLine(t, lines, "status: stopped", runnertest.DefaultWaitTimeout)
		if st := b.WaitStatus(t, slow.ID, "stopped", "failed", "completed"); st.Status != "stopped" || st.ContainerID != slowOnA.ContainerID {
			t.Fatalf("after the cancel: %+v, want stopped in container %s", st, slowOnA.ContainerID)
		}
		// The agent goes on taking prompts, and the follower sees the new
		// turn as the agent works on it.
		b.prompt(t, slow.ID, "again")
		runnertest.AwaitLine(t, lines, "Working on: again", runnertest.DefaultWaitTimeout)
		runnertest.AwaitLine(t, lines, "tool_call write notes.txt", runnertest.DefaultWaitTimeout)
		if n := countLogs(b.Logs(t, slow.ID), "started acp-slow-tool"); n != 1 {
			t.Errorf("the agent started %d times, want 1", n)
		}
	})

	t.Run("delete", func(t *testing.T) {
		for _, in := range []instance{idle, slow} {
			container := b.Status(t, in.ID).ContainerID
			if code := b.Do(t, "DELETE", "/api/v1/agents/"+in.ID, nil, nil); code != http.StatusOK {
				t.Fatalf("delete via b: HTTP %d", code)
			}
			if !processGone(t, container) {
				t.Errorf("the agent of %s (pid %s) still runs after its delete", in.ID, container)
			}
			for _, r := range []*testRunner{a, b} {
				if code := r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/status", nil, nil); code != http.StatusNotFound {
					t.Errorf("status after delete: HTTP %d", code)
				}
			}
			if _, err := records.New(st).Instance(context.Background(), in.ID); !errors.Is(err, records.ErrNotFound) {
				t.Errorf("the instance's record after delete: %v", err)
			}
		}
		// The follower's stream ends with the instance.
		for range lines {
		}
	})
}

// TestOwnerUnreachable: runner A, running two agents, stops; before their
// launches are redelivered, B is asked about them. A prompt is refused
// with 503 (it is not stored, so the client must retry); a cancel is
// written to the store, and the redelivered launch ends the turn stopped
// instead of running it; a delete removes the instance here.
func TestOwnerUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes")
	}
	t.Parallel()
	cfg, st, q := sharedState(t, map[string]string{"CONCLAVE_RUNNER_WORKERS": "2"})
	rec := records.New(st)
	ctx := context.Background()
	a, stopA := runOn(t, cfg, st, q, nil)
	x := a.Launch(t, "acp-slow-tool", a.workspace(t), map[string]string{"TASK_DESCRIPTION": "long"})
	z := a.Launch(t, "acp-slow-tool", a.workspace(t), map[string]string{"TASK_DESCRIPTION": "doomed"})
	a.WaitLog(t, x.ID, "tool_call write notes.txt")
	a.WaitLog(t, z.ID, "tool_call write notes.txt")
	// B's one worker is kept busy by an agent of its own (A's are both
	// busy, so B claims it), so that A's launches wait in the queue.
	cfgB := cfg
	cfgB.Workers = 1
	b, _ := runOn(t, cfgB, st, q, nil)
	y := b.Launch(t, "acp-slow-tool", b.workspace(t), map[string]string{"TASK_DESCRIPTION": "keeps b busy"})
	b.WaitLog(t, y.ID, "tool_call write notes.txt")
	if err := stopA(); err != nil {
		t.Fatalf("runner A: %v", err)
	}
	scrape := func() metricstest.Families { return metricstest.Scrape(t, b.Base+"/metrics") }

	var e errorBody
	if code := b.Do(t, "POST", "/api/v1/agents/"+x.ID+"/prompt", map[string]string{"message": "lost?"}, &e); code != http.StatusServiceUnavailable ||
		e.Error != api.CodeUnavailable || e.HTTPStatus != http.StatusServiceUnavailable || !strings.Contains(e.Message, "unreachable") {
		t.Fatalf("prompt with its runner gone: HTTP %d %+v", code, e)
	}
	var out struct{ ID, Status string }
	if code := b.Do(t, "POST", "/api/v1/agents/"+x.ID+"/cancel", map[string]string{"reason": "runner gone"}, &out); code != http.StatusOK || out.Status != "stopped" {
		t.Fatalf("cancel with its runner gone: HTTP %d %+v", code, out)
	}
	if code := b.Do(t, "DELETE", "/api/v1/agents/"+z.ID, nil, nil); code != http.StatusOK {
		t.Fatalf("delete with its runner gone: HTTP %d", code)
	}
	if code := b.Do(t, "GET", "/api/v1/agents/"+z.ID+"/status", nil, nil); code != http.StatusNotFound {
		t.Errorf("status after the delete: HTTP %d", code)
	}
	f := scrape()
	for _, method := range []string{"prompt", "cancel", "delete"} {
		if v := f.Value("conclave_runner_forwarded_requests_total", "method", method, "outcome", "unreachable"); v != 1 {
			t.Errorf("forwarded %s unreachable = %v, want 1", method, v)
		}
	}

	// B's worker is freed; it takes x's launch over.
	if code := b.Do(t, "DELETE", "/api/v1/agents/"+y.ID, nil, nil); code != http.StatusOK {
		t.Fatalf("delete y: HTTP %d", code)
	}
	owner := b.grpcAddr(t)
	testenv.EventuallyNoError(t, time.Minute, "B to take x over", func() error {
		in, err := rec.Instance(ctx, x.ID)
		if err != nil {
			t.Fatal(err)
		}
		if in.Owner != owner || in.Launching() {
			return fmt.Errorf("owner %s, launching %v", in.Owner, in.Launching())
		}
		if in.Status != records.StatusStopped || in.CancelTurn != 0 || in.PendingTurn() {
			t.Fatalf("x taken over: status %s, cancel_turn %d, turn %d done %d", in.Status, in.CancelTurn, in.Turn, in.TurnDone)
		}
		return nil
	})
	// The launch B took over ended the cancelled turn without starting an
	// agent for it.
	b.WaitLog(t, x.ID, "cancelled while no runner held it; nothing was started")
	// A later prompt runs on B; had the cancelled turn run, it would have
	// come first.
	b.prompt(t, x.ID, "after")
	b.WaitLog(t, x.ID, "Working on: after")
	if n := countLogs(b.Logs(t, x.ID), "Working on: long"); n != 1 {
		t.Errorf("the cancelled turn ran %d times, want 1 (before its runner stopped)", n)
	}
}
