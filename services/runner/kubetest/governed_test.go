//go:build linux

package kubetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// The governed tests run the Librarian (its local server) and the bus as
// processes of their own on dynalite and fauxqs, as the runner reaches
// them in production: over HTTP and WebSocket, with tokens. The agent runs
// in its pod behind agent-host, which relays its permission requests to
// the runner.

const (
	governedLibToken  = "lib-kubetest-governed-0123456789"
	governedReviewer  = "lib-kubetest-reviewer-0123456789"
	governedBusToken  = "bus-kubetest-runner-0123456789ab"
	governedAdminBus  = "bus-kubetest-admin-0123456789abc"
	governedAgentType = "governed"
	// governedOutside asks to edit a file outside its workspace: a
	// deviation, which the Librarian configured here escalates.
	governedOutside = "governed-outside"
)

var (
	governedBinsOnce             sync.Once
	binsErr                      error
	librarianBinPath, busBinPath string
)

// governedBins builds the Librarian's local server and the bus, once.
func governedBins(t *testing.T) (librarian, bus string) {
	t.Helper()
	governedBinsOnce.Do(func() {
		// In the run's directory, which setUp removes (a directory of
		// their own was left behind, every run).
		dir := filepath.Join(env.dir, "governed-bin")
		binsErr = testenv.GoBuild(context.Background(), dir+string(filepath.Separator), "./functions/librarian/cmd/local", "./services/bus/cmd/bus")
		librarianBinPath, busBinPath = filepath.Join(dir, "local"), filepath.Join(dir, "bus")
	})
	if binsErr != nil {
		t.Fatal(binsErr)
	}
	return librarianBinPath, busBinPath
}

// governedServices starts the Librarian and the bus on dynalite and
// fauxqs, and returns the runner's overrides that point at them, and the
// Librarian's URL.
func governedServices(t *testing.T) (map[string]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	libBin, busBin := governedBins(t)
	aws := testenv.StartAWS(t, ctx)
	endpoint := httptest.NewServer(aws.Endpoint)
	t.Cleanup(endpoint.Close)
	storage := []string{"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT=" + endpoint.URL, "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test"}

	// The built-in registry with the runner's governed types, and a
	// protocol that escalates a deviation and judges targets the graph
	// does not track (docs/governance.md).
	cfgDir := t.TempDir()
	root, _ := filepath.Abs(filepath.Join("..", "..", ".."))
	agents, err := os.ReadFile(filepath.Join(root, "functions", "librarian", "config", "agents.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{governedAgentType, governedOutside} {
		agents = append(agents, fmt.Appendf(nil, "\n  %s:\n    type: runner-agent\n    capabilities: [read, write, analyze]\n    rate_limit: 1000/hour\n    allowed_targets: [all]\n", id)...)
	}
	protocol, err := os.ReadFile(filepath.Join(root, "functions", "librarian", "config", "protocol.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	protocol = []byte(strings.Replace(string(protocol), "strict_mode: true", "strict_mode: false\n    require_known_targets: false", 1))
	for name, data := range map[string][]byte{"agents.yaml": agents, "protocol.yaml": protocol} {
		if err := os.WriteFile(filepath.Join(cfgDir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lib, err := testenv.StartDeployable(ctx, "librarian", libBin, append(storage,
		"CONCLAVE_LIBRARIAN_HTTP_ADDR=127.0.0.1:0", "CONCLAVE_LIBRARIAN_CONFIG_DIR="+cfgDir, "CONCLAVE_TABLE_PREFIX=kubetest-",
		"CONCLAVE_LIBRARIAN_AGENT_TOKENS="+governedAgentType+"="+governedLibToken+","+governedOutside+"="+governedLibToken+"x",
		"CONCLAVE_LIBRARIAN_REVIEWER_TOKENS=alice="+governedReviewer)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lib.Kill)
	grants, _ := json.Marshal([]map[string]any{
		{"token": governedBusToken, "subscribe": []string{"system:librarian.*"}},
		{"token": governedAdminBus, "publish": []string{"*"}, "subscribe": []string{"*"}, "admin": true},
	})
	bus, err := testenv.StartDeployable(ctx, "bus", busBin, append(storage,
		"CONCLAVE_BUS_ADDR=127.0.0.1:0", "CONCLAVE_BUS_GRANTS="+string(grants), "CONCLAVE_TABLE_PREFIX=kubetest-")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bus.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the Librarian's log:\n%s\nthe bus's log:\n%s", lib.Log(), bus.Log())
		}
	})
	libURL := "http://" + lib.HTTPAddr
	types := filepath.Join(t.TempDir(), "agent-types.yaml")
	var b strings.Builder
	b.WriteString("agent_types:\n")
	for id, args := range map[string]string{governedAgentType: "", governedOutside: ", -permission-path, /etc/hostname"} {
		fmt.Fprintf(&b, "  - id: %s\n    image: %s\n    command: [%s%s]\n    protocol: acp\n    permission: librarian\n    enabled: true\n    timeout: 5m\n    memory_mb: 128\n    cpu_cores: 0.25\n",
			id, agentImage, agentBin, args)
	}
	if err := os.WriteFile(types, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"CONCLAVE_RUNNER_AGENT_TYPES":      types,
		"CONCLAVE_RUNNER_LIBRARIAN_URL":    libURL,
		"CONCLAVE_RUNNER_LIBRARIAN_TOKENS": governedAgentType + "=" + governedLibToken + "," + governedOutside + "=" + governedLibToken + "x",
		"CONCLAVE_RUNNER_BUS_URL":          "ws://" + bus.HTTPAddr,
		"CONCLAVE_RUNNER_BUS_TOKEN":        governedBusToken,
	}, libURL
}

type governedStatus struct {
	Status    string `json:"status"`
	ReviewURL string `json:"review_url"`
}

func (r *testRunner) governedStatus(t *testing.T, id string) governedStatus {
	t.Helper()
	var st governedStatus
	r.Do(t, "GET", "/api/v1/agents/"+id+"/status", nil, &st)
	return st
}

// TestGovernedOnTheNode: an agent in its pod asks permission; agent-host
// relays it to the runner, which asks the Librarian over HTTP. Approved at
// once, the agent writes its file. Escalated, the instance awaits approval
// while the pod waits; the runner stops mid-wait and the next one, which
// adopts the Job, takes the wait up (agent-host sends the request again;
// it is the same Librarian request); a person approves it, the decision
// arrives on the bus, and the agent writes its file.
func TestGovernedOnTheNode(t *testing.T) {
	skipShort(t)
	overrides, libURL := governedServices(t)
	state := newRunnerState(t, freeLoopbackAddr(t), overrides)
	r1 := state.run(t, nil)

	ws := workspace(t)
	in := r1.Launch(t, governedAgentType, ws, map[string]string{"TASK_DESCRIPTION": "approved at once"})
	r1.WaitStatus(t, in.ID, "completed", "failed")
	lines := r1.Logs(t, in.ID)
	if !runnertest.HasLog(lines, `permission for "write notes.txt": approved`) {
		t.Fatalf("no approval in the log: %+v", lines)
	}
	if _, err := os.Stat(filepath.Join(ws, "notes.txt")); err != nil {
		t.Fatalf("the approved agent did not write its file: %v; log %+v", err, lines)
	}

	ws2 := workspace(t)
	in2 := r1.Launch(t, governedOutside, ws2, map[string]string{"TASK_DESCRIPTION": "escalated"})
	var first governedStatus
	testenv.EventuallyNoError(t, waitTimeout, in2.ID+" to await approval", func() error {
		if first = r1.governedStatus(t, in2.ID); first.Status != "awaiting_approval" {
			return fmt.Errorf("%+v; log %+v", first, r1.Logs(t, in2.ID))
		}
		return nil
	})
	if !strings.HasPrefix(first.ReviewURL, libURL+"/review/") {
		t.Fatalf("review_url %q", first.ReviewURL)
	}
	if err := r1.stop(); err != nil {
		t.Fatalf("stopping the first runner: %v", err)
	}
	r2 := state.run(t, nil)
	testenv.EventuallyNoError(t, waitTimeout, "the second runner to take the wait up", func() error {
		lines := r2.Logs(t, in2.ID)
		escalations := 0
		for _, l := range lines {
			if strings.Contains(l.Text, "escalated to a person") {
				escalations++
			}
		}
		if escalations < 2 || r2.governedStatus(t, in2.ID).Status != "awaiting_approval" {
			return fmt.Errorf("log %+v", lines)
		}
		return nil
	})
	if again := r2.governedStatus(t, in2.ID); path.Base(again.ReviewURL) != path.Base(first.ReviewURL) {
		t.Fatalf("the wait was taken up with another request: %s, first %s", again.ReviewURL, first.ReviewURL)
	}
	if _, err := os.Stat(filepath.Join(ws2, "notes.txt")); err == nil {
		t.Fatal("the agent wrote its file before anyone decided")
	}
	body := strings.NewReader(`{"decision":"approve","comment":"Fine on the node."}`)
	req, _ := http.NewRequest("POST", libURL+"/reviews/"+path.Base(first.ReviewURL)+"/decision", body)
	req.Header.Set("Authorization", "Bearer "+governedReviewer)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("decision: HTTP %d", resp.StatusCode)
	}
	r2.WaitStatus(t, in2.ID, "completed", "failed")
	lines = r2.Logs(t, in2.ID)
	if !runnertest.HasLog(lines, "the decision came by the bus") {
		t.Errorf("the decision did not come by the bus: %+v", lines)
	}
	if _, err := os.Stat(filepath.Join(ws2, "notes.txt")); err != nil {
		t.Fatalf("the approved agent did not write its file: %v; log %+v", err, lines)
	}
	r2.delete(t, in.ID)
	r2.delete(t, in2.ID)
}
