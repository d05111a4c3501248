//go:build linux

package kubetest_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
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
	cfg := runnertest.Config(t, vars)
	st, q := runnertest.State(t, cfg)
	return &runnerState{cfg: cfg, st: st, q: q}
}

type testRunner struct {
	*runnertest.API
	st   *runnerState
	stop func() error
}

type (
	instance = runnertest.Instance
	logLine  = runnertest.LogLine
)

// waitTimeout bounds the waits on a runner and its Jobs: far longer than
// any of them takes, even with images to pull, it only keeps a hang from
// running into the whole run's timeout.
const waitTimeout = 5 * time.Minute

// run starts a runner on s, as the runner's ServiceAccount, until the test
// ends or stop is called.
func (s *runnerState) run(t *testing.T, tel *telemetry.Provider) *testRunner {
	t.Helper()
	if tel == nil {
		var err error
		if tel, err = telemetry.New(context.Background(), telemetry.Config{ServiceName: "runner"}); err != nil {
			t.Fatal(err)
		}
	}
	_, api, stop := runnertest.Start(t, s.cfg, service.Deps{Store: s.st, Queue: s.q, Logger: runnertest.Logger(t, slog.LevelInfo), Telemetry: tel, Kube: env.runnerConfig})
	api.WaitTimeout = waitTimeout
	return &testRunner{API: api, st: s, stop: stop}
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

func (r *testRunner) prompt(t *testing.T, id, message string) {
	t.Helper()
	var out struct {
		Accepted bool `json:"accepted"`
	}
	testenv.Eventually(t, waitTimeout, fmt.Sprintf("%s to take the prompt", id), func() bool {
		code := r.Do(t, "POST", "/api/v1/agents/"+id+"/prompt", map[string]any{"message": message}, &out)
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
