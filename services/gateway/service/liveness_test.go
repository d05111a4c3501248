package service_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

// silentAgentEnv, set to a gateway's address, makes the test binary a coven
// agent that registers (as its agent_id, the next variable) and then never
// sends anything: no heartbeat, ever, as coven allows.
const (
	silentAgentEnv   = "GATEWAY_TEST_SILENT_AGENT_ADDR"
	silentAgentIDEnv = "GATEWAY_TEST_SILENT_AGENT_ID"
)

// runSilentAgent is the agent process: it says "welcomed" on stdout once
// registered, then only reads, until the stream ends.
func runSilentAgent(addr string) int {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	stream, err := covenpb.NewCovenControlClient(conn).AgentStream(context.Background())
	if err == nil {
		err = stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
			AgentId: os.Getenv(silentAgentIDEnv), Name: "silent", Capabilities: []string{"chat"},
		}}})
	}
	var m *covenpb.ServerMessage
	if err == nil {
		m, err = stream.Recv()
	}
	if err != nil || m.GetWelcome() == nil {
		fmt.Fprintln(os.Stderr, "no Welcome:", m, err)
		return 1
	}
	fmt.Println("welcomed")
	for {
		if _, err := stream.Recv(); err != nil {
			fmt.Println("stream ended:", err)
			return 0
		}
	}
}

// agentProcess is a running silent agent.
type agentProcess struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// startSilentAgent runs the test binary as a silent agent named id, dialling
// addr, and returns once it is welcomed.
func startSilentAgent(t *testing.T, addr, id string) *agentProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), silentAgentEnv+"="+addr, silentAgentIDEnv+"="+id)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProcess{cmd: cmd, done: make(chan struct{})}
	welcomed := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		welcomed <- sc.Scan() && sc.Text() == "welcomed"
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // SIGKILL ends a stopped process too
		<-p.done
	})
	select {
	case ok := <-welcomed:
		if !ok {
			t.Fatalf("agent %s was not welcomed", id)
		}
	case <-time.After(time.Minute):
		t.Fatalf("agent %s: no Welcome within a minute", id)
	}
	return p
}

// blackHole is a TCP proxy to a gateway that, once cut, forwards nothing
// more either way and yet keeps both connections open: the network between
// agent and gateway is gone, and neither end is told.
type blackHole struct {
	l    net.Listener
	cut  chan struct{}
	stop chan struct{}
	once sync.Once
}

func newBlackHole(t *testing.T, target string) *blackHole {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackHole{l: l, cut: make(chan struct{}), stop: make(chan struct{})}
	var conns sync.WaitGroup
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			conns.Add(2)
			go b.forward(out, in, &conns)
			go b.forward(in, out, &conns)
		}
	}()
	t.Cleanup(func() {
		close(b.stop)
		_ = l.Close()
		conns.Wait()
	})
	return b
}

func (b *blackHole) addr() string { return b.l.Addr().String() }

func (b *blackHole) cutOff() { b.once.Do(func() { close(b.cut) }) }

func (b *blackHole) forward(dst, src net.Conn, conns *sync.WaitGroup) {
	defer conns.Done()
	defer src.Close()
	defer dst.Close()
	go func() { <-b.stop; _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-b.cut:
			<-b.stop // what was read is dropped; the connections stay open
			return
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestHeartbeatsAreOptional: with the default settings, save shorter
// keepalive for the test's sake, an agent that never sends a heartbeat
// stays registered while its connection lives, and an agent whose process
// hangs (SIGSTOP) or whose network is gone (a proxy that stops forwarding)
// is deregistered once the transport's keepalive finds it dead.
func TestHeartbeatsAreOptional(t *testing.T) {
	t.Parallel()
	const keepalive = time.Second // gRPC's shortest server ping interval
	env := map[string]string{
		"CONCLAVE_GATEWAY_CLIENT_TOKENS":               token,
		"CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS": "true",
		"CONCLAVE_GATEWAY_KEEPALIVE_TIME":              keepalive.String(),
		"CONCLAVE_GATEWAY_KEEPALIVE_TIMEOUT":           keepalive.String(),
		// Agents without tokens: the listeners bind loopback.
		"CONCLAVE_GATEWAY_GRPC_ADDR": "127.0.0.1:0",
		"CONCLAVE_GATEWAY_HTTP_ADDR": "127.0.0.1:0",
	}
	var cfg service.Config
	if err := config.Load(context.Background(), &cfg, "gateway", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard); err != nil {
		t.Fatal(err)
	}
	if cfg.AgentTimeout != 0 {
		t.Fatalf("CONCLAVE_GATEWAY_AGENT_TIMEOUT defaults to %s, want 0 (off)", cfg.AgentTimeout)
	}
	cfg.ServerID = "gw-liveness"
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	conn, _ := startWith(t, cfg, openStore(t), tel)
	addr := conn.Target()
	ctx := authed(context.Background())
	client := gatewayv1.NewGatewayServiceClient(conn)
	registered := func() map[string]bool {
		t.Helper()
		list, err := client.ListAgents(ctx, &gatewayv1.ListAgentsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, a := range list.GetAgents() {
			ids[a.GetAgentId()] = true
		}
		return ids
	}

	silent := startSilentAgent(t, addr, "silent")
	stopped := startSilentAgent(t, addr, "stopped")
	hole := newBlackHole(t, addr)
	startSilentAgent(t, hole.addr(), "cut-off")
	start := time.Now()
	if got := registered(); !got["silent"] || !got["stopped"] || !got["cut-off"] {
		t.Fatalf("registered %v, want all three", got)
	}

	if err := stopped.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	hole.cutOff()
	testenv.Eventually(t, time.Minute, "the stopped and the cut-off agents are deregistered", func() bool {
		got := registered()
		return !got["stopped"] && !got["cut-off"]
	})
	// Meanwhile, and for a few more keepalive rounds, the silent agent,
	// which answers the gateway's pings but says nothing, stays.
	if wait := 5*keepalive - time.Since(start); wait > 0 {
		time.Sleep(wait)
	}
	if !registered()["silent"] {
		t.Fatalf("the silent agent was deregistered after %s of silence", time.Since(start).Round(time.Millisecond))
	}
	select {
	case <-silent.done:
		t.Fatal("the silent agent's stream ended")
	default:
	}
}
