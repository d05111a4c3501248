package runnertest

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// The tokens of the gateways StartGateway runs: the runner's agents hold
// the pattern token that opens every agent_id, clients the client token.
const (
	GatewayAgentToken  = "runner-agents-secret-0123456789"
	GatewayClientToken = "gateway-client-secret-0123456789"
)

// Gateway is a gateway process a test started.
type Gateway struct {
	// ID is its replica's server id.
	ID                 string
	GRPCAddr, HTTPAddr string
	Cmd                *exec.Cmd
	// Out is its standard output and error.
	Out testenv.LockedBuffer
	// Done is closed once the process has exited.
	Done chan struct{}
}

// StartGateway runs the gateway binary bin as replica id with env added
// (by default an embedded store of its own) until the test ends, on ports
// of its choosing read from its "serving" line, and waits a minute at most
// for that line.
func StartGateway(t testing.TB, bin, id string, env ...string) *Gateway {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"CONCLAVE_DATA_DIR=" + t.TempDir(),
		"CONCLAVE_GATEWAY_GRPC_ADDR=127.0.0.1:0", "CONCLAVE_GATEWAY_HTTP_ADDR=127.0.0.1:0",
		"CONCLAVE_GATEWAY_SERVER_ID=" + id, "CONCLAVE_GATEWAY_CLIENT_TOKENS=" + GatewayClientToken,
		"CONCLAVE_GATEWAY_AGENT_TOKENS=*=" + GatewayAgentToken, "CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT=10s",
	}, env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	g := &Gateway{ID: id, Cmd: cmd, Done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type addrs struct{ grpc, http string }
	serving := make(chan addrs, 1)
	go func() {
		lines := bufio.NewScanner(out)
		lines.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for lines.Scan() {
			if ga, ha, ok := testenv.ServingAddrs(lines.Bytes()); ok {
				select {
				case serving <- addrs{ga, ha}:
				default:
				}
			}
			_, _ = g.Out.Write(append(lines.Bytes(), '\n'))
		}
		_ = cmd.Wait()
		close(g.Done)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-g.Done })
	select {
	case a := <-serving:
		g.GRPCAddr, g.HTTPAddr = a.grpc, a.http
	case <-g.Done:
		t.Fatalf("gateway %s exited:\n%s", id, g.Out.String())
	case <-time.After(time.Minute):
		t.Fatalf("gateway %s never served:\n%s", id, g.Out.String())
	}
	return g
}
