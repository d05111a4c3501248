package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// The runner's agent types the scenario launches, in every shape.
const (
	// acpAgentType is the example ACP agent, in the Agent Client Protocol
	// dialect (step 3).
	acpAgentType = "e2e-acp"
	// busAgentType is the same agent as a bus agent too (-bus): the type
	// the bus's default handler launches (step 2).
	busAgentType = "e2e-bus-acp"
	// toolAgentType is the bridge's example label agent as a oneshot type
	// (step 5).
	toolAgentType = "e2e-label-issue"
	// governedAgentType is the example ACP agent under the librarian
	// permission policy, asking to edit a file outside its workspace,
	// which the Librarian (librarianConfig) escalates to a person (step 7).
	governedAgentType = "e2e-governed"
	// frontDoorAgentType is the example ACP agent registered at the
	// gateway (gateway: true), under the librarian policy, calling the
	// bridge's label tool over MCP once its permission request is allowed
	// (step 8).
	frontDoorAgentType = "e2e-front-door"
)

// frontDoorTool and frontDoorArgs are the bridge tool the front-door agent
// calls, and its arguments.
const (
	frontDoorTool = "label_github_issue"
	frontDoorArgs = `{"repo_name": "conclave-ai/conclave", "issue_number": 27}`
)

// writeAgentTypes writes the runner's agent types file into dir and
// returns its path. bridgeMCP and bridgeToken are the bridge's endpoint and
// token, which the front-door agent calls.
func writeAgentTypes(t *testing.T, dir, bridgeMCP, bridgeToken string) string {
	t.Helper()
	acp := binaries(t, "./examples/acp-agent")["./examples/acp-agent"]
	label := filepath.Join(repoRoot, "examples", "tool-agents", "agents", "stdin_agent.py")
	types := fmt.Sprintf(`agent_types:
  - id: %[1]s
    command: [%[4]q, -dialect, acp]
    protocol: acp
    permission: allow
    enabled: true
  - id: %[2]s
    command: [%[4]q, -dialect, acp, -bus]
    protocol: acp
    permission: allow
    launch_env: [BUB_*]
    enabled: true
  - id: %[3]s
    command: [python3, %[5]q]
    protocol: oneshot
    args: {issue_number: --issue, repo_name: --repo}
    timeout: 60s
    enabled: true
  - id: %[6]s
    command: [%[4]q, -dialect, acp, -permission-path, /etc/hostname]
    protocol: acp
    permission: librarian
    enabled: true
  - id: %[7]s
    command: [%[4]q, -dialect, acp, -mcp-url, %[8]q, -mcp-tool, %[9]s, -mcp-args, %[10]q]
    protocol: acp
    permission: librarian
    gateway: true
    env: {ACP_AGENT_MCP_TOKEN: %[11]q}
    enabled: true
`, acpAgentType, busAgentType, toolAgentType, acp, label, governedAgentType,
		frontDoorAgentType, bridgeMCP, frontDoorTool, frontDoorArgs, bridgeToken)
	path := filepath.Join(dir, "agent-types.yaml")
	if err := os.WriteFile(path, []byte(types), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// librarianConfig writes the Librarian's configuration into a directory of
// dir: the built-in registry with the governed agent type (as an operator
// registers it; conclave dev would add it by itself), and a protocol that
// escalates a deviation to a person and judges targets the knowledge graph
// does not track (docs/governance.md). Steps 4 and 7 hold under it.
func librarianConfig(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "librarian-config")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(repoRoot, "functions", "librarian", "config")
	agents, err := os.ReadFile(filepath.Join(src, "agents.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{governedAgentType, frontDoorAgentType} {
		agents = append(agents, fmt.Appendf(nil, "\n  %s:\n    type: runner-agent\n    capabilities: [read, write, analyze]\n    rate_limit: 1000/hour\n    allowed_targets: [all]\n", typ)...)
	}
	protocol, err := os.ReadFile(filepath.Join(src, "protocol.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	protocol = []byte(strings.Replace(string(protocol), "strict_mode: true", "strict_mode: false\n    require_known_targets: false", 1))
	for name, data := range map[string][]byte{"agents.yaml": agents, "protocol.yaml": protocol} {
		if err := os.WriteFile(filepath.Join(out, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// telemetryEnv points a process's OpenTelemetry at the test's Jaeger, and
// has it export its spans within a fifth of a second rather than the
// batch processor's default five.
func telemetryEnv() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + jaeger.OTLPEndpoint, "OTEL_BSP_SCHEDULE_DELAY=200"}
}

// TestOneProcess runs the scenario on `conclave dev`, started as a user
// starts it: in a project directory of its own (its embedded store in
// ./.conclave, agents working there), with the runner's agent types,
// the bus's default handler, and the bridge's example tool agents.
func TestOneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("runs conclave dev, agents and Chromium against a real Jaeger")
	}
	// The shapes run side by side: each deploys a system of its own.
	t.Parallel()
	bins := binaries(t, "./cmd/conclave", "./examples/acp-agent", "./examples/coven-agent")
	project := t.TempDir()
	// The bridge's port is chosen first: the front-door agent's type names
	// its endpoint.
	bridgePort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	bridgeAddr := fmt.Sprintf("127.0.0.1:%d", bridgePort)
	types := writeAgentTypes(t, project, "http://"+bridgeAddr+"/mcp", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dev, err := testenv.StartDev(ctx, bins["./cmd/conclave"], project, []string{
		"--runner-agent-types=" + types, "--bus-runner-agent-type=" + busAgentType, "--librarian-config-dir=" + librarianConfig(t, project),
		"--bridge-config=" + filepath.Join(repoRoot, "examples", "tool-agents", "config.yaml"), "--bridge-http-addr=" + bridgeAddr,
	}, telemetryEnv())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Stop(); err != nil {
			t.Errorf("conclave dev did not stop cleanly: %v", err)
		}
	})
	for _, row := range []string{"gateway gRPC", "gateway HTTP", "bus WebSocket", "runner HTTP", "bridge HTTP", "librarian HTTP"} {
		if dev.Addr(row) == "" {
			t.Fatalf("conclave dev's endpoint table has no %q row: %v\n%s", row, dev.Addrs(), dev.Log())
		}
	}
	busURL := "ws://" + dev.Addr("bus WebSocket")
	sh := &shape{
		name:         "one-process",
		gatewayHTTP:  "http://" + dev.Addr("gateway HTTP"),
		gatewayGRPC:  dev.Addr("gateway gRPC"),
		covenAgentID: "e2e-coven-agent",
		busURL:       busURL,
		bub: func(ctx context.Context, args ...string) *exec.Cmd {
			cmd := exec.CommandContext(ctx, bins["./cmd/conclave"], append([]string{"bus"}, args...)...)
			cmd.Env = append(os.Environ(), "BUB_BUS_URL="+busURL, "BUB_AGENT_ID=e2e-operator")
			return cmd
		},
		runnerHTTP:   "http://" + dev.Addr("runner HTTP"),
		workspace:    project,
		bridgeMCP:    "http://" + dev.Addr("bridge HTTP") + "/mcp",
		librarianURL: "http://" + dev.Addr("librarian HTTP"),
	}
	ports := map[string]string{}
	for row, addr := range dev.Addrs() {
		if _, port, err := net.SplitHostPort(addr); err == nil {
			ports[port], _, _ = strings.Cut(row, " ")
		}
	}
	sh.serviceOf = serviceInOneProcess(ports)
	sh.addLog("conclave dev", dev.Log)
	runScenario(t, sh)
}
