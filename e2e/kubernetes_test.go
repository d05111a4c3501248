//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
)

// The Kubernetes shape's release, as docs/deploy.md installs it.
const (
	kubeRelease   = "conclave"
	kubeNamespace = "conclave"
	// kubePrefix is the release's tablePrefix: its tables and queues
	// in dynalite and fauxqs, the Librarian's included.
	kubePrefix = "e2e-k8s-"
	// runnerPythonImage is the runner's image with a Python interpreter
	// and the bridge's example tool agents beside it, for the oneshot
	// agent type, which runs in the runner's own container.
	runnerPythonImage = "local/runner-python"
	runnerPythonTag   = "e2e"
	// toolAgentsDir is where that image holds examples/tool-agents.
	toolAgentsDir = "/opt/tool-agents"
)

// TestKubernetes runs the scenario on the Helm chart installed on the real
// single-node cluster (kubeenv.KubeNode), on the AWS path: the gateway,
// bus and runner as the chart deploys them (two replicas each, behind
// their Services), the runner's ACP agents as Jobs behind agent-host,
// dynalite and fauxqs reached from the pods through one endpoint in the
// node's namespace; the Librarian as its Lambda bootstrap under the
// Runtime API behind an API Gateway stand-in, and the bridge as the
// process an MCP client starts, both on this host. The test and the
// programs it runs on the host (the coven agent, bub) reach the Services
// at their ClusterIPs through loopback relays (KubeNodeEnv.Expose); the
// pods export their spans to the test's Jaeger through a relay the other
// way (Forward).
func TestKubernetes(t *testing.T) {
	if testing.Short() {
		t.Skip("installs the chart on a real Kubernetes node")
	}
	t.Parallel()
	bins := binaries(t, bubCmd, bridgeCmd, librarianCmd, runnerCmd, "./examples/coven-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// The workspace is under the runner's workspace root, in the pods.
	sh := processShape("kubernetes", "/workspace/e2e")
	be := startAWS(t, ctx)

	// The images build while the node starts.
	dir := t.TempDir()
	type built struct {
		tarballs []string
		err      error
	}
	images := make(chan built, 1)
	go func() {
		tarballs, err := testenv.ConclaveImages(ctx, dir, "gateway", "bus", "agent-host", "acp-agent")
		if err == nil {
			var runner string
			runner, err = runnerPython(ctx, dir, bins[runnerCmd])
			tarballs = append(tarballs, runner)
		}
		images <- built{tarballs, err}
	}()
	node, err := kubeenv.KubeNode(ctx)
	if err != nil {
		<-images
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := node.Stop(); err != nil {
			t.Error(err)
		}
	})
	b := <-images
	if b.err != nil {
		t.Fatal(b.err)
	}
	for _, tarball := range b.tarballs {
		if err := node.ImportImage(ctx, tarball); err != nil {
			t.Fatal(err)
		}
	}
	awsInNode, err := node.ServeHTTP(be.handler)
	if err != nil {
		t.Fatal(err)
	}
	otlp, err := node.Forward(kubeenv.KubeNodeIP+":0", jaeger.OTLPEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	// The Librarian, on its Lambda harness on this host, on the same
	// dynalite and fauxqs (this host's side of them) and the release's
	// prefix: its events reach the bus's pods through the release's
	// events queue. The runner's pods ask it, for the governed agent type
	// (step 7), through a relay on the node's address; people review on
	// this host.
	aws := be.env(kubePrefix)
	runnerLibToken, frontDoorLibToken, runnerBusToken := token("librarian-runner"), token("librarian-front-door"), token("bus-runner")
	startLibrarian(t, ctx, sh, bins[librarianCmd], be.dynalite, kubePrefix, aws,
		"CONCLAVE_LIBRARIAN_CONFIG_DIR="+librarianConfig(t, t.TempDir()),
		"CONCLAVE_LIBRARIAN_AGENT_TOKENS=claude-3="+sh.librarianAgentToken+","+governedAgentType+"="+runnerLibToken+","+frontDoorAgentType+"="+frontDoorLibToken)
	librarianInNode, err := node.Forward(kubeenv.KubeNodeIP+":0", strings.TrimPrefix(sh.librarianURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	// The bridge, as an MCP client's machine runs it; the front-door
	// agent (step 8), in its Job's pod, calls it through a relay on the
	// node's address.
	startBridge(t, ctx, sh, bins[bridgeCmd], aws)
	bridgeInNode, err := node.Forward(kubeenv.KubeNodeIP+":0", strings.TrimSuffix(strings.TrimPrefix(sh.bridgeMCP, "http://"), "/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	// The front-door agent's agent-host registers it at the gateway's
	// Service with the runner's Secret's gateway token, which a pattern
	// entry of the gateway's agent tokens opens (docs/runner-agents.md).
	runnerGatewayToken := token("gateway-runner")
	sh.agentsRemote = true

	rel, err := kubeenv.NewRelease(ctx, node, kubeRelease, kubeNamespace, dir)
	if err != nil {
		t.Fatal(err)
	}
	grants, _ := json.Marshal([]map[string]any{{"token": sh.busToken, "publish": []string{"*"}, "subscribe": []string{"*"}, "admin": true},
		{"token": runnerBusToken, "subscribe": []string{"system:librarian.request.*"}}})
	if err := rel.CreateSecrets(ctx, map[string]map[string]string{
		"conclave-gateway-tokens": {"client-tokens": sh.gatewayToken, "agent-tokens": sh.covenAgentID + "=" + sh.covenAgentToken + ",*=" + runnerGatewayToken},
		"conclave-bus-secrets":    {"grants": string(grants), "peer-token": token("bus-peer"), "runner-token": sh.runnerToken},
		"conclave-runner-tokens": {"client-tokens": sh.runnerToken, "host-key": token("runner-host-key"),
			"librarian-tokens": governedAgentType + "=" + runnerLibToken + "," + frontDoorAgentType + "=" + frontDoorLibToken, "bus-token": runnerBusToken,
			"gateway-token": runnerGatewayToken},
		"conclave-aws": {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"},
	}); err != nil {
		t.Fatal(err)
	}
	version, err := kubeenv.ChartVersion()
	if err != nil {
		t.Fatal(err)
	}
	values := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(values, []byte(kubeValues(awsInNode, otlp.Addr().String(), version, "http://"+librarianInNode.Addr().String(),
		"http://"+bridgeInNode.Addr().String()+"/mcp", sh.bridgeToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	deployables := []string{"gateway", "bus", "runner"}
	for _, d := range deployables {
		sh.addLog(d+" pods", func() string {
			return rel.Logs("app.kubernetes.io/instance=" + kubeRelease + ",app.kubernetes.io/component=" + d)
		})
	}
	// The runner's agents: its Jobs' pods (agent-host and the agent).
	sh.addLog("agent pods", func() string { return rel.Logs("app.kubernetes.io/managed-by=conclave-runner") })
	if _, err := rel.Helm(ctx, "install", kubeRelease, filepath.Join(repoRoot, "helm", "conclave"),
		"--namespace", kubeNamespace, "--values", values); err != nil {
		t.Fatal(err)
	}
	for _, d := range deployables {
		_, err := rel.WaitRolledOut(ctx, kubeRelease+"-"+d, "")
		if err == nil {
			// Ready pods are not yet a reachable Service: kube-proxy
			// programs the endpoints a moment later.
			err = rel.WaitServing(ctx, kubeRelease+"-"+d)
		}
		if err != nil {
			t.Fatalf("%v\n%s", err, rel.Diagnose())
		}
	}

	// The Services, reached from this host.
	expose := func(service, port string) string {
		t.Helper()
		addr, err := rel.ServiceAddr(ctx, kubeRelease+"-"+service, port)
		if err != nil {
			t.Fatal(err)
		}
		local, err := node.Expose(addr)
		if err != nil {
			t.Fatal(err)
		}
		return local
	}
	sh.gatewayHTTP, sh.gatewayGRPC = "http://"+expose("gateway", "http"), expose("gateway", "grpc")
	sh.busURL = "ws://" + expose("bus", "http")
	sh.runnerHTTP = "http://" + expose("runner", "http")
	sh.bub = func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, bins[bubCmd], args...)
		cmd.Env = append(os.Environ(), "BUB_BUS_URL="+sh.busURL, "BUB_TOKEN="+sh.busToken, "BUB_AGENT_ID=e2e-operator")
		return cmd
	}

	runScenario(t, sh)
	if t.Failed() {
		t.Logf("the node:\n%s", rel.Diagnose())
	}
}

// kubeValues are the install's values: the aws backend at the endpoint
// the pods reach, the images as imported (never pulled), traces to the
// test's Jaeger (through a relay on the node's address), the runner on
// the Kubernetes executor with the scenario's agent types, the bus's
// default handler launching the bus agent through it; the governed agent
// type asking librarianURL, its decisions heard on the release's bus, the
// tokens for both in the runner's Secret; the front-door agent type
// (step 8) calling the bridge at bridgeMCP, registered at the gateway by
// its agent-host with the runner's Secret's gateway token. The node has
// no cluster DNS, so
// the bus reaches the runner, and its launched agents and the runner the
// bus, by the addresses the kubelet gives every pod of the namespace
// (their Services exist before the Deployments: helm creates them first).
// Each ACP agent type asks a tenth of a core (its Job's request and
// limit): the node has two, the release's six pods ask 0.8 of them, and
// the scenario's agents keep their sessions after their steps (five Jobs
// by step 9's runner agent), so at a quarter each the fifth would stay
// Pending, Insufficient cpu. The example agent idles between prompts.
func kubeValues(awsEndpoint, otlpEndpoint, version, librarianURL, bridgeMCP, bridgeToken string) string {
	return fmt.Sprintf(`backend: aws
tablePrefix: %[1]s
aws:
  region: us-east-1
  endpoint: %[2]q
  credentialsSecret: conclave-aws
image:
  pullPolicy: Never
otlp:
  endpoint: %[3]q
  insecure: true
bus:
  runnerAgentType: %[5]s
  runnerAddr: "$(CONCLAVE_RUNNER_SERVICE_HOST):$(CONCLAVE_RUNNER_SERVICE_PORT_GRPC)"
  publicUrl: "ws://$(CONCLAVE_BUS_SERVICE_HOST):$(CONCLAVE_BUS_SERVICE_PORT_HTTP)"
  settings:
    workspace: /workspace/e2e-bus
runner:
  image:
    repository: %[7]s
    tag: %[8]s
  executor: kubernetes
  kubernetes:
    imagePullPolicy: Never
  secret:
    librarianTokensKey: librarian-tokens
    busTokenKey: bus-token
    gatewayTokenKey: gateway-token
  gatewayAgents:
    enabled: true
    addr: "$(CONCLAVE_GATEWAY_SERVICE_HOST):$(CONCLAVE_GATEWAY_SERVICE_PORT_GRPC)"
  settings:
    hostOtlpEndpoint: %[3]q
    librarianUrl: %[12]q
    busUrl: "ws://$(CONCLAVE_BUS_SERVICE_HOST):$(CONCLAVE_BUS_SERVICE_PORT_HTTP)"
  agentTypes: |
    agent_types:
      - id: %[4]s
        image: conclave/acp-agent:%[9]s
        command: [/usr/local/bin/acp-agent, -dialect, acp]
        protocol: acp
        permission: allow
        memory_mb: 128
        cpu_cores: 0.1
        enabled: true
      - id: %[5]s
        image: conclave/acp-agent:%[9]s
        command: [/usr/local/bin/acp-agent, -dialect, acp, -bus]
        protocol: acp
        permission: allow
        launch_env: [BUB_*]
        memory_mb: 128
        cpu_cores: 0.1
        enabled: true
      - id: %[6]s
        command: [/usr/bin/python3, %[10]s/agents/stdin_agent.py]
        protocol: oneshot
        args: {issue_number: --issue, repo_name: --repo}
        timeout: 60s
        enabled: true
      - id: %[11]s
        image: conclave/acp-agent:%[9]s
        command: [/usr/local/bin/acp-agent, -dialect, acp, -permission-path, /etc/hostname]
        protocol: acp
        permission: librarian
        memory_mb: 128
        cpu_cores: 0.1
        enabled: true
      - id: %[13]s
        image: conclave/acp-agent:%[9]s
        command: [/usr/local/bin/acp-agent, -dialect, acp, -mcp-url, %[14]q, -mcp-tool, %[15]s, -mcp-args, %[16]q]
        protocol: acp
        permission: librarian
        gateway: true
        env: {ACP_AGENT_MCP_TOKEN: %[17]q}
        memory_mb: 128
        cpu_cores: 0.1
        enabled: true
console:
  enabled: false
`, kubePrefix, awsEndpoint, otlpEndpoint, acpAgentType, busAgentType, toolAgentType,
		runnerPythonImage, runnerPythonTag, version, toolAgentsDir, governedAgentType, librarianURL,
		frontDoorAgentType, bridgeMCP, frontDoorTool, frontDoorArgs, bridgeToken)
}

// runnerPython writes the runner's image with Python: the runner (bin) as
// the runner's own image has it, and this machine's Debian python3 with
// the libraries it loads and its standard library, and the bridge's
// example tool agents under toolAgentsDir. It is how an operator gives
// oneshot agent types their interpreter: a oneshot agent runs in the
// runner's container, as a process per call (docs/runner-agents.md).
func runnerPython(ctx context.Context, dir, bin string) (string, error) {
	const python = "/usr/bin/python3"
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return "", fmt.Errorf("the Debian python3 scripts/install-test-deps.sh installs: %w", err)
	}
	out, err := exec.CommandContext(ctx, python, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))").Output()
	if err != nil {
		return "", fmt.Errorf("%s's standard library: %w", python, err)
	}
	stdlib := strings.TrimSpace(string(out))
	files, err := testenv.HostProgramFiles(ctx, real)
	if err != nil {
		return "", err
	}
	files = append(files,
		testenv.ImageFile{Path: python, HostPath: real, Mode: 0o755},
		testenv.ImageFile{Path: "/usr/local/bin/runner", HostPath: bin, Mode: 0o755})
	// What an interpreter that runs a JSON-in, JSON-out script never
	// imports: the test suite, the GUI, the packaging tools, the caches.
	unused := []string{"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "site-packages", "dist-packages"}
	lib, err := testenv.HostTreeFiles(stdlib, "", func(rel string) bool {
		base := filepath.Base(rel)
		return slices.Contains(unused, rel) || base == "__pycache__" || strings.HasPrefix(rel, "config-")
	})
	if err != nil {
		return "", err
	}
	agents, err := testenv.HostTreeFiles(filepath.Join(repoRoot, "examples", "tool-agents"), toolAgentsDir, nil)
	if err != nil {
		return "", err
	}
	tarball := filepath.Join(dir, "runner-python.tar")
	return tarball, testenv.WriteImage(tarball, testenv.Image{
		Ref:   runnerPythonImage + ":" + runnerPythonTag,
		Files: slices.Concat(files, lib, agents),
		// Nothing to write beside the read-only root: no bytecode caches.
		Env:        []string{"PYTHONDONTWRITEBYTECODE=1"},
		Entrypoint: []string{"/usr/local/bin/runner"},
		User:       "65532:65532",
	})
}
