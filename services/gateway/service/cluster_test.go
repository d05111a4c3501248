package service_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// Real components for the cluster test: dynalite as the shared store and
// the gateway binary, built once.
var (
	dynalite   *testenv.Component
	gatewayBin string
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(silentAgentEnv); addr != "" {
		// This process is a coven agent a test started (liveness_test.go).
		os.Exit(runSilentAgent(addr))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	// The gateway binary's directory goes with the run (it was left
	// behind, 28 MB a run).
	dir, err := os.MkdirTemp("", "gateway-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	return testenv.RunWith(m, func(ctx context.Context) (*testenv.Component, error) {
		gatewayBin = filepath.Join(dir, "gateway")
		if err := testenv.GoBuild(ctx, gatewayBin, "./services/gateway/cmd/gateway"); err != nil {
			return nil, err
		}
		return testenv.Dynalite(ctx)
	}, &dynalite)
}

type replicaProc struct {
	id, grpcAddr string
	httpAddr     string
	cmd          *exec.Cmd
	mu           sync.Mutex
	out          *bytes.Buffer
	done         chan struct{}
}

func (r *replicaProc) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// startReplicaProcess runs the gateway binary as replica id over dynalite.
// It listens on a port of its own choosing, read from its "serving" log
// line, so that no other process can take the port in between.
func startReplicaProcess(t *testing.T, id, tablePrefix string) *replicaProc {
	t.Helper()
	cmd := exec.Command(gatewayBin)
	cmd.Env = append(os.Environ(),
		"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT="+dynalite.Endpoint, "CONCLAVE_TABLE_PREFIX="+tablePrefix,
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1",
		"CONCLAVE_GATEWAY_GRPC_ADDR=127.0.0.1:0", "CONCLAVE_GATEWAY_HTTP_ADDR=127.0.0.1:0",
		"CONCLAVE_GATEWAY_SERVER_ID="+id, "CONCLAVE_GATEWAY_CLIENT_TOKENS="+token,
		"CONCLAVE_GATEWAY_LEASE=2s", "CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT=2s",
		"CONCLAVE_GATEWAY_AGENT_TOKENS="+strings.Join(clusterAgentTokens, ","),
	)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	r := &replicaProc{id: id, cmd: cmd, out: &bytes.Buffer{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan [2]string, 1)
	go func() {
		// Everything the replica writes is kept for failure messages; its
		// addresses are taken from the line that announces them.
		lines := bufio.NewScanner(out)
		for lines.Scan() {
			if grpcAddr, httpAddr, ok := testenv.ServingAddrs(lines.Bytes()); ok {
				select {
				case serving <- [2]string{grpcAddr, httpAddr}:
				default:
				}
			}
			r.mu.Lock()
			r.out.Write(lines.Bytes())
			r.out.WriteByte('\n')
			r.mu.Unlock()
		}
		_ = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-r.done })
	select {
	case addrs := <-serving:
		r.grpcAddr, r.httpAddr = addrs[0], addrs[1]
		return r
	case <-r.done:
		t.Fatalf("replica %s exited:\n%s", id, r.output())
	case <-time.After(time.Minute):
		t.Fatalf("replica %s never served:\n%s", id, r.output())
	}
	return nil
}

const clusterAgentCount = 9

// clusterAgentTokens are the replicas' agent_id=token pairs: every agent of
// the cluster test authenticates its stream.
var clusterAgentTokens = func() []string {
	pairs := make([]string, clusterAgentCount)
	for i := range pairs {
		pairs[i] = fmt.Sprintf("agent-%d=agent-%d-secret-0123456789", i, i)
	}
	return pairs
}()

// withAgentToken carries id's token on an AgentStream.
func withAgentToken(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+id+"-secret-0123456789")
}

// clusterAgent is a coven agent that keeps itself connected through the
// load balancer: when its stream breaks it reconnects and re-registers,
// retrying while its old registration has not expired. A message with
// content "part" gets a text event and no end, to have an answer in flight.
type clusterAgent struct {
	id string

	mu       sync.Mutex
	serverID string
	welcomes int
	parts    int // "part" messages received
	changed  chan struct{}
}

func (a *clusterAgent) partsReceived() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.parts
}

func (a *clusterAgent) state() (string, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.serverID, a.welcomes
}

func (a *clusterAgent) run(ctx context.Context, conn *grpc.ClientConn) {
	client := covenpb.NewCovenControlClient(conn)
	for ctx.Err() == nil {
		a.session(ctx, client)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *clusterAgent) session(ctx context.Context, client covenpb.CovenControlClient) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.AgentStream(withAgentToken(sctx, a.id))
	if err != nil {
		return
	}
	if stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: a.id, Capabilities: []string{"chat"},
	}}}) != nil {
		return
	}
	m, err := stream.Recv()
	if err != nil || m.GetWelcome() == nil {
		return
	}
	a.mu.Lock()
	a.serverID = m.GetWelcome().GetServerId()
	a.welcomes++
	a.mu.Unlock()
	select {
	case a.changed <- struct{}{}:
	default:
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return
		}
		req := m.GetSendMessage()
		if req == nil {
			continue
		}
		answer := []*covenpb.MessageResponse{
			{RequestId: req.RequestId, Event: &covenpb.MessageResponse_Text{Text: a.id + ":" + req.Content}},
			{RequestId: req.RequestId, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}},
		}
		if req.GetContent() == "part" {
			a.mu.Lock()
			a.parts++
			a.mu.Unlock()
			answer = answer[:1]
		}
		for _, r := range answer {
			if stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}}) != nil {
				return
			}
		}
	}
}

// ask sends content to agentID through the load balancer and returns the
// text of the reply.
func ask(ctx context.Context, client gatewayv1.GatewayServiceClient, agentID, content string) (string, error) {
	stream, err := client.SendMessage(authed(ctx), &gatewayv1.SendMessageRequest{AgentId: agentID, Content: content})
	if err != nil {
		return "", err
	}
	var text string
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return text, nil
		}
		if err != nil {
			return text, err
		}
		text += m.GetEvent().GetText()
	}
}

func dialLB(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestClusterBehindNginx runs three gateway replica processes on one
// dynalite behind nginx (grpc_pass): agents and clients spread over the
// replicas, every client reaches every agent, a duplicate registration is
// refused across replicas, and when one replica is killed mid-answer its
// agents reconnect through nginx and re-register, the client whose request
// was cut gets a clear error, its retry with the idempotency_key gets the
// stored part of the answer from another replica (and the agent is not
// asked again), and nothing else is lost.
func TestClusterBehindNginx(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three gateway processes, nginx and dynalite")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	prefix := fmt.Sprintf("cluster%d-", time.Now().UnixNano())
	var replicas []*replicaProc
	var upstreams []string
	for i := range 3 {
		r := startReplicaProcess(t, fmt.Sprintf("gw-%d", i), prefix)
		replicas = append(replicas, r)
		upstreams = append(upstreams, r.grpcAddr)
	}
	lb, err := testenv.NginxGRPC(ctx, t.TempDir(), upstreams, "2s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Stop)

	// Agents, each on its own connection through nginx.
	const agentCount = clusterAgentCount
	agents := make([]*clusterAgent, agentCount)
	agentsCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	for i := range agents {
		agents[i] = &clusterAgent{id: fmt.Sprintf("agent-%d", i), changed: make(chan struct{}, 1)}
		go agents[i].run(agentsCtx, dialLB(t, lb.Addr))
	}
	testenv.Eventually(t, time.Minute, "every agent registered", func() bool {
		for _, a := range agents {
			if s, _ := a.state(); s == "" {
				return false
			}
		}
		return true
	})
	held := map[string]int{}
	for _, a := range agents {
		s, _ := a.state()
		held[s]++
	}
	if len(held) < 2 {
		t.Fatalf("nginx put every agent on one replica: %v", held)
	}

	// Clients, each on its own connection through nginx: every client
	// reaches every agent, wherever each landed.
	var clients []gatewayv1.GatewayServiceClient
	for range 3 {
		clients = append(clients, gatewayv1.NewGatewayServiceClient(dialLB(t, lb.Addr)))
	}
	for ci, c := range clients {
		for _, a := range agents {
			got, err := ask(ctx, c, a.id, fmt.Sprint("hi from ", ci))
			if err != nil || got != fmt.Sprintf("%s:hi from %d", a.id, ci) {
				t.Fatalf("client %d to %s: %q, %v", ci, a.id, got, err)
			}
		}
	}
	list, err := clients[0].ListAgents(authed(ctx), &gatewayv1.ListAgentsRequest{})
	if err != nil || len(list.Agents) != agentCount {
		t.Fatalf("list through nginx: %d agents, %v", len(list.GetAgents()), err)
	}

	// A duplicate registration through nginx is refused, whichever replica
	// it reaches; so is an agent with another agent's token, or none.
	register := func(ctx context.Context, id string) error {
		s, err := covenpb.NewCovenControlClient(dialLB(t, lb.Addr)).AgentStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}})
		for {
			if _, err = s.Recv(); err != nil {
				return err
			}
		}
	}
	for range 3 {
		if err := register(withAgentToken(ctx, agents[0].id), agents[0].id); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("duplicate registration through nginx: %v", err)
		}
		if err := register(withAgentToken(ctx, agents[1].id), "agent-x"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("registration of an agent with no token: %v", err)
		}
		if err := register(ctx, agents[2].id); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("registration without a token: %v", err)
		}
	}

	// Kill the replica holding agent-0 mid-answer: agent-0 has sent part of
	// its answer, which the victim has stored.
	victimID, _ := agents[0].state()
	var victim *replicaProc
	for _, r := range replicas {
		if r.id == victimID {
			victim = r
		}
	}
	cutReq := &gatewayv1.SendMessageRequest{AgentId: agents[0].id, Content: "part", IdempotencyKey: "k-cut"}
	cut, firsts := make(chan error, 1), make(chan *gatewayv1.SendMessageResponse, 1)
	go func() {
		stream, err := clients[1].SendMessage(authed(ctx), cutReq)
		for err == nil {
			var m *gatewayv1.SendMessageResponse
			if m, err = stream.Recv(); err == nil && m.GetEvent().GetText() != "" {
				firsts <- m
			}
		}
		cut <- err
	}()
	var partial *gatewayv1.SendMessageResponse
	select {
	case partial = <-firsts:
	case err := <-cut:
		t.Fatalf("the request to agent-0 ended before its first event: %v", err)
	case <-ctx.Done():
		t.Fatal("no first event from agent-0")
	}
	testenv.Eventually(t, time.Minute, "the part of the answer sent to be stored", func() bool {
		h, err := clients[2].History(authed(ctx), &gatewayv1.HistoryRequest{ThreadId: partial.GetThreadId()})
		return err == nil && len(h.GetEntries()) == 2 && h.GetEntries()[1].GetEvent().GetText() == agents[0].id+":part"
	})
	_, before := agents[0].state()
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done

	select {
	case err := <-cut:
		// Forwarded by a surviving replica, the cut is UNAVAILABLE with a
		// reason. Sent by nginx straight to the victim, whose stream had
		// begun (its first response carries the request_id at once), nginx
		// can only reset the stream: INTERNAL, "RST_STREAM". Either way the
		// client gets an error, not a hang, and may retry with its
		// idempotency_key (docs/gateway-clients.md).
		st := status.Convert(err)
		cutByProxy := st.Code() == codes.Internal && strings.Contains(st.Message(), "RST_STREAM")
		if (st.Code() != codes.Unavailable || st.Message() == "") && !cutByProxy {
			t.Fatalf("the cut request ended with %v, want UNAVAILABLE with a reason, or nginx's reset", err)
		}
	case <-ctx.Done():
		t.Fatal("the cut request never ended")
	}

	// Retried with its idempotency_key, through nginx to a surviving
	// replica: the part stored is replayed, and the cut told, without
	// asking the agent again.
	var replayed []*gatewayv1.SendMessageResponse
	var replayErr error
	testenv.Eventually(t, time.Minute, "the retry of the cut request to be replayed", func() bool {
		replayed, replayErr = nil, nil
		stream, err := clients[2].SendMessage(authed(ctx), cutReq)
		for err == nil {
			var m *gatewayv1.SendMessageResponse
			if m, err = stream.Recv(); err == nil {
				replayed = append(replayed, m)
			}
		}
		replayErr = err
		// While nginx still tries the dead replica first, the retry fails
		// before any response.
		return len(replayed) > 0
	})
	if len(replayed) != 2 || !replayed[0].GetReplayed() || replayed[0].GetRequestId() != partial.GetRequestId() ||
		replayed[1].GetEvent().GetText() != agents[0].id+":part" || replayed[1].GetEntryId() != partial.GetEntryId() {
		t.Fatalf("the replay of the cut request: %v", replayed)
	}
	if st := status.Convert(replayErr); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "incomplete") {
		t.Fatalf("the replay ended with %v, want UNAVAILABLE saying the answer is incomplete", replayErr)
	}

	// Its agents come back through nginx on the surviving replicas, once
	// their leases on the dead one have expired.
	testenv.Eventually(t, time.Minute, "agent-0 re-registered elsewhere", func() bool {
		s, n := agents[0].state()
		return n > before && s != victimID
	})
	for _, a := range agents {
		a := a
		testenv.Eventually(t, time.Minute, a.id+" on a live replica", func() bool {
			s, _ := a.state()
			return s != victimID && s != ""
		})
	}
	if n := agents[0].partsReceived(); n != 1 {
		t.Fatalf("agent-0 got the cut message %d times, want once", n)
	}
	// Nothing else was lost: every agent answers every client again.
	for ci, c := range clients {
		for _, a := range agents {
			var got string
			testenv.EventuallyNoError(t, time.Minute, fmt.Sprintf("client %d reaching %s", ci, a.id), func() error {
				got, err = ask(ctx, c, a.id, "again")
				return err
			})
			if got != a.id+":again" {
				t.Fatalf("client %d to %s after the kill: %q", ci, a.id, got)
			}
		}
	}
}
