package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// Paths to real binaries built once for this package's tests: conclave
// itself, and grpcurl from the pinned tools module.
var conclaveBin, grpcurlBin string

func TestMain(m *testing.M) {
	if os.Getenv(busAgentEnv) != "" {
		os.Exit(runBusAgent())
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	// The governed tests' services on dynalite and fauxqs load the AWS
	// SDK's configuration: test credentials, never a developer's.
	os.Setenv("AWS_ACCESS_KEY_ID", "test")
	os.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	os.Unsetenv("AWS_PROFILE")
	os.Unsetenv("AWS_SESSION_TOKEN")
	dir, remove, err := testenv.GoBuildTemp(context.Background(), "conclave-test", "./cmd/conclave")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	conclaveBin = filepath.Join(dir, "conclave")
	if !testing.Short() {
		// The example agent beside conclave, as `make build` leaves it, so
		// that conclave dev has its example-agent type.
		if err := testenv.GoBuild(context.Background(), filepath.Join(dir, exampleAgentBinary), "./examples/acp-agent"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if grpcurlBin, err = toolBinary("grpcurl", "github.com/fullstorydev/grpcurl/cmd/grpcurl"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}

// toolBinary returns the cached tool binary, building it from the tools
// module when `make tools` has not run yet.
func toolBinary(name, pkg string) (string, error) {
	root, err := filepath.Abs("../..")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(root, ".cache", "bin", name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = filepath.Join(root, "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, out)
	}
	return bin, nil
}

// devProcess starts `conclave dev` on free loopback ports, serving the
// example tool agents, with extra flags, and returns it, the endpoint
// table's addresses ("gateway gRPC", "gateway HTTP", ...) and its log.
func devProcess(t *testing.T, dataDir string, extra ...string) (*testenv.Dev, map[string]string, *testenv.LockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := testenv.StartDev(ctx, conclaveBin, "", append([]string{"--bridge-config=../../examples/tool-agents/config.yaml", "--data-dir", dataDir}, extra...), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	if d.Addr("gateway gRPC") == "" {
		t.Fatalf("endpoint table incomplete: %v\nstderr:\n%s", d.Addrs(), d.Log())
	}
	return d, d.Addrs(), d.LogBuffer()
}

func TestDevServesCovenAndHealth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary and uses grpcurl")
	}
	t.Parallel()
	dataDir := t.TempDir()
	// A boolean flag works bare.
	cmd, addrs, stderr := devProcess(t, dataDir, "--gateway-allow-unauthenticated")

	out, err := exec.Command(grpcurlBin, "-plaintext", addrs["gateway gRPC"], "list").CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl list: %v\n%s", err, out)
	}
	for _, want := range []string{"coven.CovenControl", "grpc.health.v1.Health"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("grpcurl list lacks %s:\n%s", want, out)
		}
	}
	out, err = exec.Command(grpcurlBin, "-plaintext", addrs["gateway gRPC"], "grpc.health.v1.Health/Check").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SERVING") {
		t.Errorf("health check: %v\n%s", err, out)
	}

	// The Librarian is open on loopback: no token, the caller names its agent.
	resp, err := http.Get("http://" + addrs["librarian HTTP"] + "/agent/capabilities?agent_id=claude-3")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"agent_type":"code-generator"`) {
		t.Errorf("librarian capabilities: %d %s", resp.StatusCode, body)
	}
	// The bus answers a client written from the bub protocol, without a token.
	checkBus(t, "ws://"+addrs["bus WebSocket"])

	// Ctrl-C stops it cleanly.
	if err := cmd.Cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("conclave dev did not exit cleanly on SIGINT: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr.String(), "conclave dev stopped") {
		t.Errorf("no stop message:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "state.db")); err != nil {
		t.Errorf("the embedded store is not in the data directory: %v", err)
	}
}

func TestBadSettingExitsWithOneLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"port not a number", nil, []string{"CONCLAVE_GATEWAY_GRPC_ADDR=:abc"}, "CONCLAVE_GATEWAY_GRPC_ADDR"},
		{"port flag not a number", []string{"--gateway-http-addr=localhost:eighty"}, nil, "CONCLAVE_GATEWAY_HTTP_ADDR"},
		{"unknown backend", nil, []string{"CONCLAVE_BACKEND=postgres"}, "CONCLAVE_BACKEND"},
		{"dev on aws", nil, []string{"CONCLAVE_BACKEND=aws"}, "CONCLAVE_BACKEND"},
		{"bad duration", nil, []string{"CONCLAVE_GATEWAY_AGENT_TIMEOUT=soon"}, "CONCLAVE_GATEWAY_AGENT_TIMEOUT"},
		{"negative duration", nil, []string{"CONCLAVE_GATEWAY_AGENT_TIMEOUT=-1s"}, "CONCLAVE_GATEWAY_AGENT_TIMEOUT"},
		{"bad log level", nil, []string{"CONCLAVE_LOG_LEVEL=chatty"}, "CONCLAVE_LOG_LEVEL"},
		// Without authentication, every listener stays on loopback.
		{"gateway HTTP on every interface", []string{"--gateway-http-addr=0.0.0.0:0"}, nil, "CONCLAVE_GATEWAY_HTTP_ADDR"},
		{"gateway gRPC on every interface", []string{"--gateway-grpc-addr=:0"}, nil, "CONCLAVE_GATEWAY_GRPC_ADDR"},
		{"librarian on every interface", []string{"--librarian-http-addr=0.0.0.0:0"}, nil, "CONCLAVE_LIBRARIAN_HTTP_ADDR"},
		{"bridge on every interface", []string{"--bridge-http-addr=[::]:0"}, nil, "CONCLAVE_BRIDGE_HTTP_ADDR"},
		{"bus on every interface", nil, []string{"CONCLAVE_BUS_ADDR=0.0.0.0:0"}, "CONCLAVE_BUS_ADDR"},
		{"runner gRPC on every interface", []string{"--runner-grpc-addr=0.0.0.0:0"}, nil, "CONCLAVE_RUNNER_GRPC_ADDR"},
		{"runner HTTP on another address", []string{"--runner-http-addr=192.0.2.1:0"}, nil, "CONCLAVE_RUNNER_HTTP_ADDR"},
		{"console on every interface", []string{"--console-http-addr=0.0.0.0:0"}, nil, "CONCLAVE_CONSOLE_HTTP_ADDR"},
		// No token shorter than 16 characters, anywhere.
		{"short gateway client token", nil, []string{"CONCLAVE_GATEWAY_CLIENT_TOKENS=fifteen-chars-x"}, "CONCLAVE_GATEWAY_CLIENT_TOKENS"},
		{"short gateway agent token", nil, []string{"CONCLAVE_GATEWAY_AGENT_TOKENS=agent-1=fifteen-chars-x"}, "CONCLAVE_GATEWAY_AGENT_TOKENS"},
		{"short runner token", nil, []string{"CONCLAVE_RUNNER_CLIENT_TOKENS=fifteen-chars-x"}, "CONCLAVE_RUNNER_CLIENT_TOKENS"},
		{"short bridge token", nil, []string{"CONCLAVE_BRIDGE_TOKENS=fifteen-chars-x"}, "CONCLAVE_BRIDGE_TOKENS"},
		{"short bus peer token", nil, []string{"CONCLAVE_BUS_PEER_TOKEN=fifteen-chars-x"}, "CONCLAVE_BUS_PEER_TOKEN"},
		{"short bus runner token", nil, []string{"CONCLAVE_BUS_RUNNER_TOKEN=fifteen-chars-x"}, "CONCLAVE_BUS_RUNNER_TOKEN"},
		{"short librarian agent token", nil, []string{"CONCLAVE_LIBRARIAN_AGENT_TOKENS=claude-3=fifteen-chars-x"}, "CONCLAVE_LIBRARIAN_AGENT_TOKENS"},
		{"short librarian reviewer token", nil, []string{"CONCLAVE_LIBRARIAN_REVIEWER_TOKENS=alice=fifteen-chars-x"}, "CONCLAVE_LIBRARIAN_REVIEWER_TOKENS"},
		{"short console bus token", nil, []string{"CONCLAVE_CONSOLE_EVENTS_BUS_TOKEN=fifteen-chars-x"}, "CONCLAVE_CONSOLE_EVENTS_BUS_TOKEN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// A setting accepted by mistake would serve until killed.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, conclaveBin, append([]string{"dev"}, tt.args...)...)
			cmd.Env = append(os.Environ(), tt.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("want a non-zero exit, got %v", err)
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tt.want) {
				t.Fatalf("want one line naming %s, got:\n%s", tt.want, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("nothing should be served or printed: %s", stdout.String())
			}
		})
	}
}

// -h shows each setting's real type and default, booleans as bare flags,
// and conclave dev's own defaults where it overrides a service's.
func TestDevHelpShowsTypesAndDefaults(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(conclaveBin, "dev", "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("conclave dev -h: %v\n%s", err, out)
	}
	for _, want := range []string{
		"--gateway-allow-unauthenticated\n", "(env CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED, default true)",
		"--gateway-lease duration\n", "(env CONCLAVE_GATEWAY_LEASE, default 15s)",
		"--gateway-grpc-addr host:port\n", "default 127.0.0.1:50051)",
		"--gateway-queue-depth int\n", "--gateway-client-rate float\n", "--gateway-client-tokens list\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("conclave dev -h lacks %q:\n%s", want, out)
		}
	}
}

func TestCommands(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args    []string
		wantOut string
		wantErr string
	}{
		{[]string{"version"}, "conclave ", ""},
		{[]string{"help"}, "Commands:", ""},
		{nil, "", "no command"},
		{[]string{"launch-rockets"}, "", `unknown command "launch-rockets"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), tt.args, &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !strings.Contains(stdout.String(), tt.wantOut) {
				t.Fatalf("err = %v, stdout = %q", err, stdout.String())
			}
		})
	}
}

// checkBus initializes on the bus at url as the bub protocol's first example does
// and pings it.
func checkBus(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial the bus at %s: %v", url, err)
	}
	defer c.CloseNow()
	for _, frame := range []string{
		`{"jsonrpc":"2.0","method":"initialize","params":{"clientId":"agent-1","clientInfo":{"name":"bub","version":"0.2.0"}},"id":1}`,
		`{"jsonrpc":"2.0","method":"ping","params":{},"id":100}`,
	} {
		if err := c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		_, answer, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(answer), `"result"`) {
			t.Errorf("bus answered %s to %s", answer, frame)
		}
	}
}
