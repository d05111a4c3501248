package agent_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/examples/coven-agent/agent"
	"github.com/conclave-ai/conclave/pkg/testenv"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// These tests run the agent against the real gateway: the conclave binary,
// built once, serving `conclave dev`.
var conclaveBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	dir, remove, err := testenv.GoBuildTemp(context.Background(), "coven-agent-test", "./cmd/conclave")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	conclaveBin = filepath.Join(dir, "conclave")
	return m.Run()
}

// gateway is a running `conclave dev`; addr is its gateway's gRPC address.
type gateway struct {
	*testenv.Dev
	addr string
}

// integration opens a test that runs `conclave dev`: skipped under
// -short, run in parallel with the other tests.
func integration(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs conclave dev")
	}
	t.Parallel()
}

// startGateway runs `conclave dev` with its gRPC listener on addr (port 0
// for a free one), every other service on a free port too so that tests
// can run side by side, and returns once it prints where it listens.
func startGateway(t *testing.T, addr string, env ...string) *gateway {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	d, err := testenv.StartDev(ctx, conclaveBin, "", []string{"--gateway-grpc-addr=" + addr, "--data-dir", t.TempDir()}, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill)
	g := &gateway{Dev: d, addr: d.Addr("gateway gRPC")}
	if g.addr == "" {
		t.Fatalf("conclave dev printed no gRPC address: %v\nstderr:\n%s", d.Addrs(), d.Log())
	}
	return g
}

// logs collects an agent's log lines for the test to wait on.
type logs struct{ testenv.LockedBuffer }

func (l *logs) count(s string) int { return strings.Count(l.String(), s) }

// await waits up to a minute for the agent's log to hold s: exactly n
// times, or at least once when n is 0. A failed wait names what it waited
// for and shows the log so far.
func (l *logs) await(t *testing.T, what, s string, n int) {
	t.Helper()
	testenv.EventuallyNoError(t, time.Minute, what, func() error {
		if c := l.count(s); c == 0 || n > 0 && c != n {
			return fmt.Errorf("agent log:\n%s", l)
		}
		return nil
	})
}

const registered = `msg="registered with the gateway"`

// startAgent runs the agent with quick reconnects until the test ends.
func startAgent(t *testing.T, addr, id string) *logs {
	t.Helper()
	l := &logs{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{
			Addr: addr, AgentID: id, Name: "test-agent", Heartbeat: 100 * time.Millisecond,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v after a clean stop", err)
		}
	})
	return l
}

// rawStream registers id on its own stream, as a second agent would.
type rawStream struct {
	stream grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage]
	cancel context.CancelFunc
}

func register(t *testing.T, addr, id string) (*rawStream, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	st, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
	if err == nil {
		err = st.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}})
	}
	var m *covenpb.ServerMessage
	if err == nil {
		m, err = st.Recv()
	}
	for err == nil && m.GetWelcome() == nil {
		_, err = st.Recv() // after a RegistrationError comes the status
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &rawStream{stream: st, cancel: cancel}, nil
}

// leave closes the stream's side and waits for the gateway to deregister it.
func (r *rawStream) leave(t *testing.T) {
	t.Helper()
	defer r.cancel()
	if err := r.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := r.stream.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("stream ended with %v, want a clean end", err)
			}
			return
		}
	}
}

// assertHeld proves id is registered by someone else: the gateway refuses a
// second registration with ALREADY_EXISTS.
func assertHeld(t *testing.T, addr, id string) {
	t.Helper()
	r, err := register(t, addr, id)
	if err == nil {
		r.leave(t)
		t.Fatalf("registered %s myself: the agent does not hold it", id)
	}
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second registration = %v, want ALREADY_EXISTS", err)
	}
}

func TestAgentRegistersAndLeavesCleanly(t *testing.T) {
	integration(t)
	gw := startGateway(t, "127.0.0.1:0")
	id := agent.NewID()
	l := &logs{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.Config{Addr: gw.addr, AgentID: id, Logger: slog.New(slog.NewTextHandler(l, nil))})
	}()
	l.await(t, "the agent registers", registered, 1)
	assertHeld(t, gw.addr, id)

	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after ctx ends", err)
	}
	// The agent said goodbye before Run returned: its ID is free at once.
	r, err := register(t, gw.addr, id)
	if err != nil {
		t.Fatalf("the agent's ID is still taken after it stopped: %v", err)
	}
	r.leave(t)
}

func TestAgentPresentsItsToken(t *testing.T) {
	integration(t)
	id := agent.NewID()
	gw := startGateway(t, "127.0.0.1:0", "CONCLAVE_GATEWAY_AGENT_TOKENS="+id+"=right-token-0123456789")
	tests := []struct {
		name, token string
		want        codes.Code
	}{
		{"wrong token", "wrong-token", codes.Unauthenticated},
		{"no token", "", codes.Unauthenticated},
		{"right token", "right-token-0123456789", codes.OK},
	}
	for _, tt := range tests {
		l := &logs{}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- agent.Run(ctx, agent.Config{Addr: gw.addr, AgentID: id, Token: tt.token, Logger: slog.New(slog.NewTextHandler(l, nil))})
		}()
		if tt.want == codes.OK {
			l.await(t, "the agent registers", registered, 1)
			stop()
		}
		// A refused token is not retried: Run returns the gateway's status.
		err := <-done
		stop()
		if status.Code(err) != tt.want {
			t.Fatalf("%s: Run = %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestAgentRetriesWhileItsIDIsTaken(t *testing.T) {
	integration(t)
	gw := startGateway(t, "127.0.0.1:0")
	id := agent.NewID()
	squatter, err := register(t, gw.addr, id)
	if err != nil {
		t.Fatal(err)
	}
	l := startAgent(t, gw.addr, id)
	l.await(t, "the agent is refused", "AlreadyExists", 0)

	squatter.leave(t)
	l.await(t, "the agent registers once the ID is free", registered, 1)
	assertHeld(t, gw.addr, id)
}

func TestAgentHeartbeatsKeepItRegistered(t *testing.T) {
	integration(t)
	gw := startGateway(t, "127.0.0.1:0", "CONCLAVE_GATEWAY_AGENT_TIMEOUT=1s")
	id := agent.NewID()
	l := startAgent(t, gw.addr, id)
	l.await(t, "the agent registers", registered, 1)

	// A silent agent registered after ours is dropped once the agent timeout
	// has passed; by then ours has lived longer than that on heartbeats.
	silent, err := register(t, gw.addr, agent.NewID())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.cancel()
	if _, err := silent.stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("silent agent: %v, want DEADLINE_EXCEEDED", err)
	}
	assertHeld(t, gw.addr, id)
	if n := l.count(registered); n != 1 {
		t.Errorf("the agent registered %d times, want once: heartbeats should have kept it\n%s", n, l)
	}
}

func TestAgentReconnectsAfterTheGatewayDies(t *testing.T) {
	integration(t)
	first := startGateway(t, "127.0.0.1:0")
	id := agent.NewID()
	l := startAgent(t, first.addr, id)
	l.await(t, "the agent registers", registered, 1)

	first.Kill()
	l.await(t, "the agent notices", "reconnecting", 0)

	second := startGateway(t, first.addr)
	l.await(t, "the agent registers again", registered, 2)
	assertHeld(t, second.addr, id)
}

func TestAgentMovesOnWhenTheGatewayShutsDown(t *testing.T) {
	integration(t)
	first := startGateway(t, "127.0.0.1:0")
	id := agent.NewID()
	l := startAgent(t, first.addr, id)
	l.await(t, "the agent registers", registered, 1)

	// SIGTERM drains the gateway: it sends Shutdown and waits for its agents
	// to leave. The agent closes its side, so the drain ends cleanly.
	if err := first.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("gateway did not drain cleanly: %v\n%s", err, first.Log())
	}
	const left = `error="gateway asked the agent to leave: gateway dev is shutting down"`
	l.await(t, "the agent leaves on Shutdown", left, 1)

	// Behind a load balancer the agent would now reach another replica; here
	// another gateway takes the address.
	second := startGateway(t, first.addr)
	l.await(t, "the agent registers with the new gateway", registered, 2)
	assertHeld(t, second.addr, id)
}
