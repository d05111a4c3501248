//go:build linux

package kubetest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs agents on a real Kubernetes node")
	}
}

// TestKubernetesExecutor runs the example agent in pods on the real node
// through the runner's REST API.
func TestKubernetesExecutor(t *testing.T) {
	skipShort(t)
	r := newRunnerState(t, freeLoopbackAddr(t), nil).run(t, nil)

	t.Run("ConversationAndSecret", func(t *testing.T) {
		t.Parallel()
		const secret = "sk-kubetest-secret-value"
		ws := workspace(t)
		in := r.Launch(t, "normal", ws, map[string]string{"TASK_DESCRIPTION": "first", "OPENAI_API_KEY": secret})
		lines := r.Follow(t, in.ID, 1000)
		// The first turn's updates stream to the API client as the agent
		// in its pod makes them.
		runnertest.AwaitLine(t, lines, "content: Working on: first", waitTimeout)
		runnertest.AwaitLine(t, lines, "tool_call write notes.txt", waitTimeout)
		in = r.WaitStatus(t, in.ID, "completed")
		if _, err := os.Stat(filepath.Join(ws, "notes.txt")); err != nil {
			t.Errorf("the agent's tool call wrote no notes.txt in the workspace claim: %v", err)
		}
		r.prompt(t, in.ID, "second")
		runnertest.AwaitLine(t, lines, "content: Working on: second", waitTimeout)
		r.WaitStatus(t, in.ID, "completed")

		// The pod's phase reaches the log as the kubelet reports it, which
		// may be after the agent has already answered: the kubelet notices
		// a started container on its next relist.
		got := r.WaitLog(t, in.ID, "pod "+in.ContainerID+": running")
		if !runnertest.HasLog(got, "acp-agent: env OPENAI_API_KEY="+secret) {
			t.Errorf("the agent did not see the secret env: %+v", got)
		}
		if runnertest.HasLog(got, "CONCLAVE_AGENT_HOST_TOKEN=") {
			t.Errorf("the agent saw agent-host's token")
		}

		// The value is in the launch's Secret, owned by the Job, and never
		// in the Job's or the pod's spec.
		ctx := t.Context()
		job, err := env.admin.BatchV1().Jobs(namespace).Get(ctx, in.ContainerID, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods, err := env.admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("the Job's pods: %v, %v", pods, err)
		}
		for what, obj := range map[string]any{"Job": job, "pod": pods.Items[0]} {
			data, _ := json.Marshal(obj)
			if strings.Contains(string(data), secret) {
				t.Errorf("the %s holds the secret value", what)
			}
		}
		s, err := env.admin.CoreV1().Secrets(namespace).Get(ctx, job.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(s.Data["OPENAI_API_KEY"]) != secret || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != job.UID {
			t.Errorf("the launch's Secret: data keys %v, owners %+v", keys(s.Data), s.OwnerReferences)
		}
		if res := pods.Items[0].Spec.Containers[0].Resources; res.Limits.Memory().String() != "128Mi" || res.Requests.Cpu().String() != "250m" {
			t.Errorf("the agent's container resources are %+v, want the type's memory_mb and cpu_cores", res)
		}

		// The replica counts agent-host's stream.
		f := metricstest.Scrape(t, r.Base+"/metrics")
		if f.Value("conclave_runner_host_connects_total", "outcome", "accepted") < 1 || !f.Has("conclave_runner_host_streams") {
			t.Errorf("host metrics: connects accepted %v, streams series %v", f.Value("conclave_runner_host_connects_total", "outcome", "accepted"), f.Has("conclave_runner_host_streams"))
		}

		r.delete(t, in.ID)
		waitGone(t, job.Name)
	})

	t.Run("CancelThenPromptAgain", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "slow-tool", workspace(t), map[string]string{"TASK_DESCRIPTION": "long work"})
		lines := r.Follow(t, in.ID, 1000)
		runnertest.AwaitLine(t, lines, "tool_call write notes.txt", waitTimeout)
		in = r.Status(t, in.ID)
		if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/cancel", map[string]any{"reason": "changed my mind"}, nil); code != http.StatusOK {
			t.Fatalf("cancel: HTTP %d", code)
		}
		r.WaitStatus(t, in.ID, "stopped")
		// The same pod takes the next prompt.
		r.prompt(t, in.ID, "more work")
		runnertest.AwaitLine(t, lines, "content: Working on: more work", waitTimeout)
		if st := r.Status(t, in.ID); st.ContainerID != in.ContainerID || st.Status != "running" {
			t.Errorf("after the second prompt: %+v, want running in %s", st, in.ContainerID)
		}
		r.delete(t, in.ID)
		waitGone(t, in.ContainerID)
	})

	t.Run("CrashIsFailedWithExitCode", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "crash", workspace(t), map[string]string{"TASK_DESCRIPTION": "crash"})
		r.WaitStatus(t, in.ID, "failed")
		lines := r.WaitLog(t, in.ID, "launch 1 ended")
		if !runnertest.HasLog(lines, "exit code 3") {
			t.Errorf("the failure does not give the agent's exit code: %+v", lines)
		}
	})

	t.Run("TimeoutIsDeadlineExceeded", func(t *testing.T) {
		t.Parallel()
		in := r.Launch(t, "hang", workspace(t), map[string]string{"TASK_DESCRIPTION": "never ends"})
		r.WaitStatus(t, in.ID, "failed")
		lines := r.WaitLog(t, in.ID, "launch 1 ended")
		if !runnertest.HasLog(lines, "deadline exceeded") {
			t.Errorf("the failure does not say the Job's deadline passed: %+v", lines)
		}
	})
}

func (r *testRunner) delete(t *testing.T, id string) {
	t.Helper()
	if code := r.Do(t, "DELETE", "/api/v1/agents/"+id, nil, nil); code != http.StatusOK {
		t.Fatalf("delete: HTTP %d", code)
	}
}

// waitGone waits for a launch's Job, its pods and Secret to be deleted.
func waitGone(t *testing.T, job string) {
	t.Helper()
	ctx := t.Context()
	testenv.EventuallyNoError(t, waitTimeout, "Job "+job+", its Secret and its pods deleted", func() error {
		_, jobErr := env.admin.BatchV1().Jobs(namespace).Get(ctx, job, metav1.GetOptions{})
		_, secretErr := env.admin.CoreV1().Secrets(namespace).Get(ctx, job, metav1.GetOptions{})
		pods, err := env.admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
		if err != nil {
			t.Fatal(err)
		}
		if !apierrors.IsNotFound(jobErr) || !apierrors.IsNotFound(secretErr) || len(pods.Items) != 0 {
			return fmt.Errorf("the Job: %v; the Secret: %v; %d pods", jobErr, secretErr, len(pods.Items))
		}
		return nil
	})
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestRunnerRestartMidPrompt stops the runner while its agent's turn
// streams: agent-host buffers what the agent says, and the runner started
// again in its place adopts the Job and receives every update once, in
// order, without running the turn again.
func TestRunnerRestartMidPrompt(t *testing.T) {
	skipShort(t)
	state := newRunnerState(t, freeLoopbackAddr(t), nil)
	r1 := state.run(t, nil)
	ws := workspace(t)
	in := r1.Launch(t, "gated", ws, map[string]string{"TASK_DESCRIPTION": "go"})
	r1.WaitLog(t, in.ID, "content: Working on: go")
	in = r1.Status(t, in.ID)
	if err := r1.stop(); err != nil {
		t.Fatalf("stopping the first runner: %v", err)
	}
	// With no runner, the agent streams its whole turn into agent-host.
	if err := os.WriteFile(filepath.Join(ws, "release"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyNoError(t, waitTimeout, "the agent to stream its turn into agent-host", func() error {
		_, err := os.Stat(filepath.Join(ws, "streamed"))
		return err
	})
	r2 := state.run(t, nil)
	r2.WaitStatus(t, in.ID, "completed")
	if st := r2.Status(t, in.ID); st.ContainerID != in.ContainerID {
		t.Errorf("the second runner's container is %s, want the first's Job %s adopted", st.ContainerID, in.ContainerID)
	}
	lines := r2.Logs(t, in.ID)
	var chunks []string
	for _, l := range lines {
		if strings.HasPrefix(l.Text, "content: chunk ") {
			chunks = append(chunks, l.Text)
		}
	}
	if want := chunkLines(200); !slices.Equal(chunks, want) {
		t.Errorf("the turn's updates: %d lines, want chunks 1-200 once each in order: %q", len(chunks), chunks)
	}
	if n := count(lines, "content: Working on: go"); n != 1 {
		t.Errorf("the turn started %d times", n)
	}
	r2.delete(t, in.ID)
	waitGone(t, in.ContainerID)
}

// TestServiceAccountRBAC: the chart's Role lets the runner's
// ServiceAccount do what the executor does, and nothing more.
func TestServiceAccountRBAC(t *testing.T) {
	skipShort(t)
	t.Parallel()
	for _, tt := range []struct {
		verb, group, resource, subresource, ns string
		allowed                                bool
	}{
		{"create", "batch", "jobs", "", namespace, true},
		{"get", "batch", "jobs", "", namespace, true},
		{"list", "batch", "jobs", "", namespace, true},
		{"watch", "batch", "jobs", "", namespace, true},
		{"delete", "batch", "jobs", "", namespace, true},
		{"list", "", "pods", "", namespace, true},
		{"watch", "", "pods", "", namespace, true},
		{"create", "", "secrets", "", namespace, true},
		{"patch", "", "secrets", "", namespace, true},
		{"delete", "", "secrets", "", namespace, true},

		{"update", "batch", "jobs", "", namespace, false},
		{"create", "batch", "jobs", "", "default", false},
		{"get", "", "secrets", "", namespace, false},
		{"list", "", "secrets", "", namespace, false},
		{"watch", "", "secrets", "", namespace, false},
		{"create", "", "pods", "", namespace, false},
		{"create", "", "pods", "exec", namespace, false},
		{"delete", "", "pods", "", namespace, false},
		{"list", "", "nodes", "", "", false},
		{"list", "batch", "jobs", "", "", false},
		{"create", "rbac.authorization.k8s.io", "roles", "", namespace, false},
		{"create", "", "serviceaccounts", "token", namespace, false},
	} {
		allowed, err := canI(t.Context(), env.runnerSA, tt.verb, tt.group, tt.resource, tt.subresource, tt.ns)
		if err != nil {
			t.Fatal(err)
		}
		if allowed != tt.allowed {
			t.Errorf("%s %s/%s/%s in %q: allowed %v, want %v", tt.verb, tt.group, tt.resource, tt.subresource, tt.ns, allowed, tt.allowed)
		}
	}
}

// TestOneTrace follows a launch from the API client's span through the
// runner, the Job's start, agent-host and the agent to its update, in one
// trace in the real Jaeger.
func TestOneTrace(t *testing.T) {
	skipShort(t)
	t.Parallel()
	state := newRunnerState(t, freeLoopbackAddr(t), map[string]string{
		"CONCLAVE_RUNNER_EVENTS_QUEUE": "traced-events",
		// agent-host exports its spans as it exits: once the agent idles.
		"CONCLAVE_RUNNER_IDLE_TIMEOUT": "1s",
	})
	r := state.run(t, env.jaeger.Provider(t, "runner"))
	resp, body, traceID := env.jaeger.PostTraced(t, t.Context(), "launch an agent", r.Base+"/api/v1/agents/launch",
		`{"task_id":"traced","agent_type":"normal","workspace_path":"`+workspace(t)+`","env":{"TASK_DESCRIPTION":"trace me"}}`)
	var in instance
	_ = json.Unmarshal(body, &in)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("launch: HTTP %d %s", resp.StatusCode, body)
	}

	// The agent's update came out as an event of the trace.
	for found := false; !found; {
		msgs, err := state.q.Receive(t.Context(), "traced-events", queue.ReceiveOptions{Max: 10, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			e, err := queue.DecodeEnvelope(m.Body)
			if err != nil {
				t.Fatal(err)
			}
			if e.GetType() == "runner.session.update" && e.GetSubjectIds()["instance_id"] == in.ID {
				if !strings.Contains(e.GetTraceContext().GetTraceparent(), traceID) {
					t.Fatalf("update event %s is in %v, want trace %s", e.GetId(), e.GetTraceContext(), traceID)
				}
				found = true
			}
		}
	}
	r.WaitLog(t, in.ID, "launch 1 ended")

	want := map[string][]string{
		"client":              {"launch an agent"},
		"runner":              {"start agent"},
		"conclave-agent-host": {"agent-host", "acp initialize", "acp session/prompt"},
	}
	var tr *testenv.JaegerTrace
	testenv.EventuallyNoError(t, waitTimeout, "trace "+traceID+"'s spans from the client, the runner and agent-host", func() error {
		var err error
		if tr, err = env.jaeger.WaitTrace(t.Context(), traceID, 6); err != nil {
			t.Fatal(err)
		}
		have := map[string]map[string]bool{}
		for _, s := range tr.Spans {
			if have[s.ServiceName] == nil {
				have[s.ServiceName] = map[string]bool{}
			}
			have[s.ServiceName][s.OperationName] = true
		}
		for service, ops := range want {
			for _, op := range ops {
				if !have[service][op] {
					return fmt.Errorf("the trace has %v, want %v", have, want)
				}
			}
		}
		return nil
	})
	start, host := tr.Span("start agent"), tr.Span("agent-host")
	if start.Tags["conclave.executor"] != "kubernetes" || start.Tags["conclave.container_id"] != r.Status(t, in.ID).ContainerID {
		t.Errorf("the runner's start agent span: %+v", start)
	}
	// agent-host, in the Job's pod, continues the span that created the Job.
	if host.ParentSpanID != start.SpanID {
		t.Errorf("agent-host's span's parent is %s, want the runner's start agent span %s", host.ParentSpanID, start.SpanID)
	}
}
