//go:build linux

package kubetest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
	"github.com/conclave-ai/conclave/services/runner/service"
)

// agentTypes is the registry the runners use: the example agent in the
// modes the tests need, run from its image.
func agentTypes(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("agent_types:\n")
	for _, tt := range []struct {
		id      string
		args    string
		timeout string
	}{
		{"normal", "-mode, normal, -print-env", "5m"},
		{"gated", "-mode, gated, -chunks, '200'", "5m"},
		{"slow-tool", "-mode, slow-tool", "5m"},
		{"crash", "-mode, crash", "5m"},
		{"hang", "-mode, hang", "20s"},
	} {
		// A launch may set OPENAI_API_KEY, the secret env
		// TestKubernetesExecutor passes.
		fmt.Fprintf(&b, "  - id: %s\n    image: %s\n    command: [%s, %s]\n    protocol: acp\n    permission: allow\n    launch_env: [OPENAI_API_KEY]\n    enabled: true\n    timeout: %s\n    memory_mb: 128\n    cpu_cores: 0.25\n",
			tt.id, agentImage, agentBin, tt.args, tt.timeout)
	}
	// Registered at the gateway; no resources asked, so that a hundred
	// fit on the node (TestHundredGatewayAgents).
	fmt.Fprintf(&b, "  - id: on-gateway\n    image: %s\n    command: [%s, -mode, normal]\n    protocol: acp\n    permission: allow\n    gateway: true\n    capabilities: [chat]\n    enabled: true\n    timeout: 15m\n",
		agentImage, agentBin)
	path := filepath.Join(t.TempDir(), "agent-types.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runnerState is a runner's store, queue and configuration, which a
// runner started again on it takes over.
type runnerState struct {
	cfg service.Config
	st  store.Store
	q   queue.Queue
}

// newRunnerState configures a runner on the Kubernetes executor: its gRPC
// listener at grpcAddr on loopback, which pods reach through a forward
// from the node's address.
func newRunnerState(t *testing.T, grpcAddr string, overrides map[string]string) *runnerState {
	t.Helper()
	fwd, err := env.node.Forward(kubeenv.KubeNodeIP+":0", grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fwd.Close() })
	vars := map[string]string{
		"CONCLAVE_RUNNER_GRPC_ADDR":              grpcAddr,
		"CONCLAVE_RUNNER_HTTP_ADDR":              "127.0.0.1:0",
		"CONCLAVE_RUNNER_SERVER_ID":              "kubetest",
		"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED":  "true",
		"CONCLAVE_RUNNER_WORKSPACE_ROOTS":        env.workspaces,
		"CONCLAVE_RUNNER_AGENT_TYPES":            agentTypes(t),
		"CONCLAVE_RUNNER_LAUNCH_RETRY":           "2s",
		"CONCLAVE_RUNNER_IDLE_TIMEOUT":           "5m",
		"CONCLAVE_RUNNER_CLIENT_RATE":            "1000000",
		"CONCLAVE_RUNNER_CLIENT_BURST":           "1000000",
		"CONCLAVE_RUNNER_EXECUTOR":               "kubernetes",
		"CONCLAVE_RUNNER_HOST_KEY":               "kubetest-host-key-of-at-least-32-bytes",
		"CONCLAVE_RUNNER_HOST_ADDR":              fwd.Addr().String(),
		"CONCLAVE_RUNNER_HOST_OTLP_ENDPOINT":     env.otlp,
		"CONCLAVE_RUNNER_KUBE_NAMESPACE":         namespace,
		"CONCLAVE_RUNNER_KUBE_HOST_IMAGE":        hostImage,
		"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY": "Never",
		"CONCLAVE_RUNNER_KUBE_WORKSPACE_CLAIM":   workspaceClaim,
		"CONCLAVE_RUNNER_KUBE_WORKSPACE_ROOT":    env.workspaces,
	}
	for k, v := range overrides {
		vars[k] = v
	}
	var cfg struct{ Runner service.Config }
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	if err := config.Load(context.Background(), &cfg, "runner", nil, lookup, io.Discard); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	for _, d := range service.Queues(cfg.Runner) {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	return &runnerState{cfg: cfg.Runner, st: st, q: q}
}

type testRunner struct {
	base string
	st   *runnerState
	stop func() error
}

// run starts a runner on s, as the runner's ServiceAccount, until the test
// ends or stop is called.
func (s *runnerState) run(t *testing.T, tel *telemetry.Provider) *testRunner {
	t.Helper()
	ctx := context.Background()
	if tel == nil {
		var err error
		if tel, err = telemetry.New(ctx, telemetry.Config{ServiceName: "runner"}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := service.New(s.cfg, service.Deps{Store: s.st, Queue: s.q, Logger: testLogger(t), Telemetry: tel, Kube: env.runnerConfig})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	var (
		once   sync.Once
		runErr error
	)
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("runner.Run: %v", err)
		}
	})
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("runner stopped: %v", err)
	}
	tr := &testRunner{st: s, stop: stop}
	for _, e := range r.Endpoints() {
		if strings.HasPrefix(e.Protocol, "HTTP") {
			tr.base = "http://" + e.Address
		}
	}
	return tr
}

// workspace makes a workspace directory the agents' pods can write.
func workspace(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(env.workspaces, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (r *testRunner) do(t *testing.T, ctx context.Context, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequestWithContext(ctx, method, r.base+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

type instance struct {
	ID          string `json:"id"`
	ContainerID string `json:"container_id"`
	Status      string `json:"status"`
}

func (r *testRunner) launch(t *testing.T, agentType, ws string, vars map[string]string) instance {
	t.Helper()
	var in instance
	if code := r.do(t, t.Context(), "POST", "/api/v1/agents/launch", map[string]any{
		"task_id": "task-" + strings.ReplaceAll(t.Name(), "/", "-"), "agent_type": agentType, "workspace_path": ws, "env": vars,
	}, &in); code != http.StatusOK {
		t.Fatalf("launch %s: HTTP %d %+v", agentType, code, in)
	}
	return in
}

func (r *testRunner) prompt(t *testing.T, id, message string) {
	t.Helper()
	var out struct {
		Accepted bool `json:"accepted"`
	}
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("%s to take the prompt", id), func() bool {
		code := r.do(t, t.Context(), "POST", "/api/v1/agents/"+id+"/prompt", map[string]any{"message": message}, &out)
		if code == http.StatusOK && out.Accepted {
			return true
		}
		// A prompt while a turn is still ending is refused (400, "cannot
		// take this now"): try again.
		if code != http.StatusBadRequest {
			t.Fatalf("prompt: HTTP %d", code)
		}
		return false
	})
}

func (r *testRunner) status(t *testing.T, id string) instance {
	t.Helper()
	var in instance
	if code := r.do(t, t.Context(), "GET", "/api/v1/agents/"+id+"/status", nil, &in); code != http.StatusOK {
		t.Fatalf("status: HTTP %d", code)
	}
	return in
}

// waitTimeout bounds the waits on a runner and its Jobs: far longer than
// any of them takes, even with images to pull, it only keeps a hang from
// running into the whole run's timeout.
const waitTimeout = 5 * time.Minute

func (r *testRunner) waitStatus(t *testing.T, id string, want ...string) instance {
	t.Helper()
	var in instance
	testenv.EventuallyNoError(t, waitTimeout, fmt.Sprintf("%s to be %v", id, want), func() error {
		in = r.status(t, id)
		if !slices.Contains(want, in.Status) {
			return fmt.Errorf("status %s", in.Status)
		}
		return nil
	})
	return in
}

type logLine struct {
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

func (r *testRunner) logs(t *testing.T, id string) []logLine {
	t.Helper()
	var out struct {
		Lines []logLine `json:"lines"`
	}
	if code := r.do(t, t.Context(), "GET", "/api/v1/agents/"+id+"/logs?tail=1000", nil, &out); code != http.StatusOK {
		t.Fatalf("logs: HTTP %d", code)
	}
	return out.Lines
}

// waitLog polls the logs until a line contains want, and returns them.
func (r *testRunner) waitLog(t *testing.T, id, want string) []logLine {
	t.Helper()
	var lines []logLine
	testenv.EventuallyNoError(t, waitTimeout, fmt.Sprintf("log line %q of %s", want, id), func() error {
		if lines = r.logs(t, id); !hasLog(lines, want) {
			return fmt.Errorf("the log: %+v", lines)
		}
		return nil
	})
	return lines
}

func hasLog(lines []logLine, want string) bool {
	for _, l := range lines {
		if strings.Contains(l.Text, want) {
			return true
		}
	}
	return false
}

// follow streams GET .../logs?follow=true, as an API client watches an
// agent; the channel closes when the stream ends.
func (r *testRunner) follow(t *testing.T, id string) <-chan logLine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", r.base+"/api/v1/agents/"+id+"/logs?follow=true&tail=1000", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("follow: HTTP %d", resp.StatusCode)
	}
	out := make(chan logLine, 4096)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Text != "" {
				out <- l
			}
		}
	}()
	return out
}

// await reads lines until one contains want.
func await(t *testing.T, lines <-chan logLine, want string) {
	t.Helper()
	for l := range lines {
		if strings.Contains(l.Text, want) {
			return
		}
	}
	t.Fatalf("the log stream ended before %q", want)
}

// canI asks the API server whether the ServiceAccount (of the test's
// namespace) may do verb on resource (group/resource[/subresource]) in ns
// ("" cluster-wide).
func canI(ctx context.Context, sa, verb, group, resource, subresource, ns string) (bool, error) {
	return kubeenv.ServiceAccountCan(ctx, env.admin, namespace, sa, authorizationv1.ResourceAttributes{
		Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: subresource,
	})
}

// count is how many lines have exactly text.
func count(lines []logLine, text string) int {
	n := 0
	for _, l := range lines {
		if l.Text == text {
			n++
		}
	}
	return n
}

func chunkLines(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "content: chunk " + strconv.Itoa(i+1)
	}
	return out
}
