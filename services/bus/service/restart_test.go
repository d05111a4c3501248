package service_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// busBinary is cmd/bus and bubBinary cmd/bub, built once by TestMain for
// the tests that run them as processes of their own.
var busBinary, bubBinary string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "bus-test-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	dir += string(filepath.Separator)
	busBinary = filepath.Join(dir, "bus")
	bubBinary = filepath.Join(dir, "bub")
	if err := testenv.GoBuild(context.Background(), dir, "./services/bus/cmd/bus", "./services/bus/cmd/bub"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// busProcess runs cmd/bus on dataDir and addr, and returns it once it
// serves.
func busProcess(t *testing.T, dataDir, addr string) *testenv.Deployable {
	t.Helper()
	return serveProcess(t, exec.Command(busBinary), dataDir, addr)
}

// serveProcess runs cmd, a bus (cmd/bus, or bub serve), on dataDir and
// addr ("127.0.0.1:0": any port), and returns it once it serves.
func serveProcess(t *testing.T, cmd *exec.Cmd, dataDir, addr string) *testenv.Deployable {
	t.Helper()
	cmd.Env = append(os.Environ(), "CONCLAVE_DATA_DIR="+dataDir, "CONCLAVE_BUS_ADDR="+addr,
		"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED=true", "OTEL_EXPORTER_OTLP_ENDPOINT=")
	ctx, cancel := context.WithTimeout(t.Context(), guard)
	defer cancel()
	d, err := testenv.StartCommand(ctx, "the bus", cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	return d
}

// TestRestartLosesNoRetry kills the bus process (SIGKILL, no drain) while a
// retry is pending, starts it again on the same data, and checks the retry
// still arrives.
func TestRestartLosesNoRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: runs the bus as a process")
	}
	t.Parallel()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	url := "ws://" + addr
	first := busProcess(t, dataDir, addr)

	agent := dial(t, url, nil)
	agent.initialize("agent-durable", agentCaps)
	agent.subscribe(2, "agent:durable", "")
	pub := dial(t, url, nil)
	pub.initialize("pub", "")
	pub.publish(3, "agent:durable", `{"type":"task_request","task_id":"survives"}`)
	id, _ := agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":false,"should_retry":true,"retry_seconds":2,"message":"later"}`)
	ack := testenv.At[map[string]any](t, pub.response(3), "result", "acks", 0)
	if !contains(testenv.At[string](t, ack, "message"), "scheduled") {
		t.Fatalf("ack %v", ack)
	}

	// The retry was accepted: kill the bus before it is due.
	first.Kill()

	busProcess(t, dataDir, addr)
	again := dial(t, url, nil)
	again.initialize("agent-durable", agentCaps)
	again.subscribe(2, "agent:durable", "")
	id, params := again.expectRequest("processMessage")
	if testenv.At[map[string]any](t, params, "payload")["task_id"] != "survives" || params["attempt"] != float64(2) {
		t.Errorf("retry after the restart: %v", params)
	}
	again.reply(id, `{"processed":true}`)
}
