package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	librarianservice "github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// The deployables of the split shape, by their main packages.
const (
	gatewayCmd   = "./services/gateway/cmd/gateway"
	busCmd       = "./services/bus/cmd/bus"
	bubCmd       = "./services/bus/cmd/bub"
	runnerCmd    = "./services/runner/cmd/runner"
	bridgeCmd    = "./services/bridge/cmd/bridge"
	librarianCmd = "./functions/librarian"
	consoleCmd   = "./services/console/cmd/console"
)

// TestSplitProcesses runs the scenario on the AWS path: every deployable
// as its own process (services/*/cmd/*) with its production settings and
// tokens required, on dynalite and fauxqs behind one AWS endpoint, and the
// Librarian as its Lambda bootstrap under a Lambda Runtime API, served over
// HTTP as API Gateway serves it.
func TestSplitProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every deployable, dynalite, fauxqs, agents and Chromium against a real Jaeger")
	}
	t.Parallel()
	bins := binaries(t, gatewayCmd, busCmd, bubCmd, runnerCmd, bridgeCmd, librarianCmd, consoleCmd, "./examples/acp-agent", "./examples/coven-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sh := processShape("split-processes", t.TempDir())
	be := startAWS(t, ctx)
	const prefix = "e2e-"
	aws := be.env(prefix)
	start := func(name, bin string, env ...string) *testenv.Deployable {
		t.Helper()
		return startProcess(t, ctx, sh, name, bin, slices.Concat(aws, env)...)
	}

	// The Librarian first: the runner's governed agent types ask it (steps
	// 7 and 8); the gateway and the bridge, where the runner registers its
	// front-door agent and which that agent calls (step 8); then the
	// runner: the bus's default handler launches through it. The bus's
	// address is chosen now, for the runner to hear the Librarian's
	// decisions there.
	runnerLibToken, frontDoorLibToken, runnerBusToken, runnerGatewayToken := token("librarian-runner"), token("librarian-front-door"), token("bus-runner"), token("gateway-runner")
	startLibrarian(t, ctx, sh, bins[librarianCmd], be.dynalite, prefix, aws,
		"CONCLAVE_LIBRARIAN_CONFIG_DIR="+librarianConfig(t, t.TempDir()),
		"CONCLAVE_LIBRARIAN_AGENT_TOKENS=claude-3="+sh.librarianAgentToken+","+governedAgentType+"="+runnerLibToken+","+frontDoorAgentType+"="+frontDoorLibToken)
	// The runner registers its agents under their instance ids, which a
	// pattern's token opens (docs/gateway.md).
	gw := start("gateway", bins[gatewayCmd], "CONCLAVE_GATEWAY_GRPC_ADDR=127.0.0.1:0", "CONCLAVE_GATEWAY_HTTP_ADDR=127.0.0.1:0",
		"CONCLAVE_GATEWAY_SERVER_ID=gateway-1", "CONCLAVE_GATEWAY_CLIENT_TOKENS="+sh.gatewayToken,
		"CONCLAVE_GATEWAY_AGENT_TOKENS="+sh.covenAgentID+"="+sh.covenAgentToken+",*="+runnerGatewayToken)
	sh.gatewayHTTP, sh.gatewayGRPC = "http://"+gw.HTTPAddr, gw.GRPCAddr
	startBridge(t, ctx, sh, bins[bridgeCmd], aws)
	busPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	types := writeAgentTypes(t, t.TempDir(), sh.bridgeMCP, sh.bridgeToken)
	rn := start("runner", bins[runnerCmd], "CONCLAVE_RUNNER_GRPC_ADDR=127.0.0.1:0", "CONCLAVE_RUNNER_HTTP_ADDR=127.0.0.1:0",
		"CONCLAVE_RUNNER_SERVER_ID=runner-1", "CONCLAVE_RUNNER_CLIENT_TOKENS="+sh.runnerToken,
		"CONCLAVE_RUNNER_AGENT_TYPES="+types, "CONCLAVE_RUNNER_WORKSPACE_ROOTS="+sh.workspace,
		"CONCLAVE_RUNNER_LIBRARIAN_URL="+sh.librarianURL,
		"CONCLAVE_RUNNER_LIBRARIAN_TOKENS="+governedAgentType+"="+runnerLibToken+","+frontDoorAgentType+"="+frontDoorLibToken,
		fmt.Sprintf("CONCLAVE_RUNNER_BUS_URL=ws://127.0.0.1:%d", busPort), "CONCLAVE_RUNNER_BUS_TOKEN="+runnerBusToken,
		"CONCLAVE_RUNNER_GATEWAY_ADDR="+sh.gatewayGRPC, "CONCLAVE_RUNNER_GATEWAY_TOKEN="+runnerGatewayToken)
	sh.runnerHTTP = "http://" + rn.HTTPAddr
	grants, _ := json.Marshal([]map[string]any{{"token": sh.busToken, "publish": []string{"*"}, "subscribe": []string{"*"}, "admin": true},
		{"token": runnerBusToken, "subscribe": []string{"system:librarian.request.*"}}})
	bs := start("bus", bins[busCmd], fmt.Sprintf("CONCLAVE_BUS_ADDR=127.0.0.1:%d", busPort), "CONCLAVE_BUS_SERVER_ID=bus-1", "CONCLAVE_BUS_GRANTS="+string(grants),
		"CONCLAVE_BUS_RUNNER_ADDR="+rn.GRPCAddr, "CONCLAVE_BUS_RUNNER_AGENT_TYPE="+busAgentType,
		"CONCLAVE_BUS_RUNNER_TOKEN="+sh.runnerToken, "CONCLAVE_BUS_WORKSPACE="+sh.workspace)
	sh.busURL = "ws://" + bs.HTTPAddr
	sh.bub = func(ctx context.Context, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, bins[bubCmd], args...)
		cmd.Env = append(os.Environ(), "BUB_BUS_URL="+sh.busURL, "BUB_TOKEN="+sh.busToken, "BUB_AGENT_ID=e2e-operator")
		return cmd
	}
	// The console, to draw a step's trace from Jaeger (after the steps).
	con := startProcess(t, ctx, sh, "console", bins[consoleCmd], slices.Concat(telemetryEnv(), []string{"CONCLAVE_CONSOLE_HTTP_ADDR=127.0.0.1:0",
		"CONCLAVE_CONSOLE_GATEWAY_URL=" + sh.gatewayHTTP, "CONCLAVE_CONSOLE_BUS_URL=" + sh.busURL, "CONCLAVE_CONSOLE_RUNNER_URL=" + sh.runnerHTTP,
		"CONCLAVE_CONSOLE_LIBRARIAN_URL=" + sh.librarianURL, "CONCLAVE_CONSOLE_JAEGER_URL=" + jaeger.QueryURL})...)
	sh.console, sh.consoleToken = "http://"+con.HTTPAddr, sh.runnerToken

	runScenario(t, sh)
}

// processShape is a shape whose deployables each run as a process of
// their own, as in production (split processes, Kubernetes): with tokens
// required, and each reporting its own service.name. workspace is a
// directory under the runner's workspace roots.
func processShape(name, workspace string) *shape {
	return &shape{name: name, covenAgentID: "e2e-coven-agent",
		gatewayToken: token("gateway-client"), covenAgentToken: token("coven-agent"), busToken: token("bus-admin"),
		runnerToken: token("runner-client"), bridgeToken: token("bridge"), librarianAgentToken: token("librarian-claude"),
		reviewerToken: token("librarian-alice"), workspace: workspace,
		serviceOf: serviceByProcess(map[string]string{"conclave-gateway": gateway, "conclave-bus": bus, "conclave-runner": runner,
			"conclave-bridge": bridge, "conclave-librarian": librarian}),
	}
}

// awsBackends are dynalite and fauxqs, and one endpoint serving both, as
// CONCLAVE_AWS_ENDPOINT wants (testenv.AWSEndpoint).
type awsBackends struct {
	// dynalite is dynalite's own endpoint.
	dynalite string
	// handler serves both; url is it on a loopback port.
	handler http.Handler
	url     string
}

func startAWS(t *testing.T, ctx context.Context) *awsBackends {
	t.Helper()
	b := testenv.StartAWS(t, ctx)
	return &awsBackends{dynalite: b.Dynalite, handler: b.Endpoint, url: serve(t, b.Endpoint)}
}

// env is a deployable's settings for the backends, on this host, with
// prefix before its tables' and queues' names, and the test's telemetry.
func (b *awsBackends) env(prefix string) []string {
	return slices.Concat([]string{"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT=" + b.url, "CONCLAVE_TABLE_PREFIX=" + prefix,
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1",
		// Nothing of the developer's AWS settings may leak in.
		"AWS_PROFILE=", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}, telemetryEnv())
}

// startProcess starts a deployable as a process of its own
// (testenv.StartDeployable), adds its log to the report and stops it when
// the test ends.
func startProcess(t *testing.T, ctx context.Context, sh *shape, name, bin string, env ...string) *testenv.Deployable {
	t.Helper()
	d, err := testenv.StartDeployable(ctx, name, bin, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("%s did not stop cleanly: %v", name, err)
		}
	})
	sh.addLog(name, d.Log)
	return d
}

// startBridge starts the bridge with the example tool agents and sets
// sh.bridgeMCP. env is its storage's and telemetry's settings.
func startBridge(t *testing.T, ctx context.Context, sh *shape, bin string, env []string) {
	t.Helper()
	br := startProcess(t, ctx, sh, "bridge", bin, slices.Concat(env, []string{"CONCLAVE_BRIDGE_HTTP_ADDR=127.0.0.1:0",
		"CONCLAVE_BRIDGE_CONFIG=" + filepath.Join(repoRoot, "examples", "tool-agents", "config.yaml"), "CONCLAVE_BRIDGE_TOKENS=" + sh.bridgeToken})...)
	sh.bridgeMCP = "http://" + br.HTTPAddr + "/mcp"
}

// startLibrarian starts the Librarian as it runs on AWS: its tables, as
// infra/ creates them (the function creates none: its cold start makes no
// network call), then its bootstrap (bin) under the Lambda Runtime API,
// served over HTTP as an API Gateway HTTP API serves it. aws is its
// storage's settings (CONCLAVE_BACKEND=aws, the endpoint, the prefix);
// its queue is the bus's bus-events under that prefix. It sets
// sh.librarianURL and adds the function's log to the report.
func startLibrarian(t *testing.T, ctx context.Context, sh *shape, bin, dynaliteEndpoint, prefix string, aws []string, extra ...string) {
	t.Helper()
	st := store.NewDynamo(testenv.DynamoDBClient(dynaliteEndpoint), store.DynamoOptions{TablePrefix: prefix, Endpoint: dynaliteEndpoint})
	if err := store.EnsureTables(ctx, st, librarianservice.Tables...); err != nil {
		t.Fatal(err)
	}
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sh.librarianURL = "http://" + front.Addr().String()
	rt, err := testenv.StartLambda(bin, slices.Concat(aws, []string{
		// The function exports over OTLP/HTTP, flushing at each invocation's end.
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + jaeger.OTLPHTTPEndpoint,
		"CONCLAVE_LIBRARIAN_AGENT_TOKENS=claude-3=" + sh.librarianAgentToken,
		"CONCLAVE_LIBRARIAN_REVIEWER_TOKENS=alice=" + sh.reviewerToken,
		"CONCLAVE_LIBRARIAN_BASE_URL=" + sh.librarianURL}, extra)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Stop)
	sh.addLog("librarian", rt.Output)
	if err := rt.Ready(ctx); err != nil {
		t.Fatalf("the Librarian's bootstrap: %v\n%s", err, rt.Output())
	}
	apigw := &http.Server{Handler: testenv.APIGateway(rt), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = apigw.Serve(front) }()
	t.Cleanup(func() { _ = apigw.Close() })
}

// serve serves h on a free loopback port until the test ends, and returns
// its base URL.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// token is a fresh bearer token, named for what it is for.
func token(name string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}
