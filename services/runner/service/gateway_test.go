package service_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

const (
	gwAgentToken  = runnertest.GatewayAgentToken
	gwClientToken = runnertest.GatewayClientToken
)

var gatewayBuild struct {
	sync.Once
	bin string
	err error
}

// gatewayBinary is cmd/gateway, built once for the tests that need it.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	gatewayBuild.Do(func() {
		gatewayBuild.bin = filepath.Join(filepath.Dir(agentBin), "gateway")
		gatewayBuild.err = testenv.GoBuild(context.Background(), gatewayBuild.bin, "./services/gateway/cmd/gateway")
	})
	if gatewayBuild.err != nil {
		t.Fatal(gatewayBuild.err)
	}
	return gatewayBuild.bin
}

type gatewayProc = runnertest.Gateway

// startGateway runs cmd/gateway as replica id with env added (by default
// an embedded store of its own).
func startGateway(t *testing.T, id string, env ...string) *gatewayProc {
	t.Helper()
	return runnertest.StartGateway(t, gatewayBinary(t), id, env...)
}

// gatewayClient is the gateway's client API at addr, with the client token.
func gatewayClient(t *testing.T, addr string) gatewayv1.GatewayServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gwClientToken), method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gwClientToken), desc, cc, method, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return gatewayv1.NewGatewayServiceClient(conn)
}

// launchOnGateway launches agentType with metadata asking for the gateway
// under agentID, and waits for its session to be up.
func (r *testRunner) launchOnGateway(t *testing.T, agentType, agentID string) instance {
	t.Helper()
	var in instance
	md := map[string]any{"gateway": true}
	if agentID != "" {
		md["gateway_agent_id"] = agentID
	}
	if code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
		"task_id": "task-" + strings.ReplaceAll(t.Name(), "/", "-"), "agent_type": agentType, "workspace_path": r.workspace(t), "metadata": md,
	}, &in); code != http.StatusOK {
		t.Fatalf("launch %s: HTTP %d %+v", agentType, code, in)
	}
	r.WaitStatus(t, in.ID, "running")
	return in
}

// awaitAgent waits until the gateway lists agentID (listed) or no longer
// does, and returns its entry.
func awaitAgent(t *testing.T, gw gatewayv1.GatewayServiceClient, agentID string, listed bool) *gatewayv1.Agent {
	t.Helper()
	what := "the gateway to list agent " + agentID
	if !listed {
		what = "the gateway to stop listing agent " + agentID
	}
	var agent *gatewayv1.Agent
	testenv.EventuallyNoError(t, time.Minute, what, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := gw.ListAgents(ctx, &gatewayv1.ListAgentsRequest{PageSize: 1000})
		cancel()
		if err != nil {
			return err
		}
		i := slices.IndexFunc(resp.GetAgents(), func(a *gatewayv1.Agent) bool { return a.GetAgentId() == agentID })
		if listed != (i >= 0) {
			return fmt.Errorf("listed %d agents", len(resp.GetAgents()))
		}
		if listed {
			agent = resp.GetAgents()[i]
		}
		return nil
	})
	return agent
}

// send sends content to agentID and returns every event until the one
// that ends the request; onEvent, if set, sees each as it comes.
func send(t *testing.T, gw gatewayv1.GatewayServiceClient, agentID, thread, content string, onEvent func(requestID string, e *covenpb.MessageResponse)) []*covenpb.MessageResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := gw.SendMessage(ctx, &gatewayv1.SendMessageRequest{AgentId: agentID, ThreadId: thread, Sender: "test", Content: content})
	if err != nil {
		t.Fatalf("SendMessage: %v", err)
	}
	var events []*covenpb.MessageResponse
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("SendMessage to %s: the stream ended before the request did (%v); events %v", agentID, err, events)
		}
		e := m.GetEvent()
		if e == nil {
			continue // the first response: the request id alone
		}
		events = append(events, e)
		if onEvent != nil {
			onEvent(m.GetRequestId(), e)
		}
		switch e.GetEvent().(type) {
		case *covenpb.MessageResponse_Done, *covenpb.MessageResponse_Error, *covenpb.MessageResponse_Cancelled:
			return events
		}
	}
}

// describe is an event in one line: its kind and what the test checks of it.
func describe(e *covenpb.MessageResponse) string {
	switch ev := e.GetEvent().(type) {
	case *covenpb.MessageResponse_Text:
		return "text: " + ev.Text
	case *covenpb.MessageResponse_Thinking:
		return "thinking: " + ev.Thinking
	case *covenpb.MessageResponse_ToolUse:
		return fmt.Sprintf("tool_use %s %s %s", ev.ToolUse.GetId(), ev.ToolUse.GetName(), ev.ToolUse.GetInputJson())
	case *covenpb.MessageResponse_ToolResult:
		return fmt.Sprintf("tool_result %s error=%v %s", ev.ToolResult.GetId(), ev.ToolResult.GetIsError(), ev.ToolResult.GetOutput())
	case *covenpb.MessageResponse_ToolState:
		return fmt.Sprintf("tool_state %s %s", ev.ToolState.GetId(), ev.ToolState.GetState())
	case *covenpb.MessageResponse_Done:
		return "done: " + ev.Done.GetFullResponse()
	case *covenpb.MessageResponse_Error:
		return "error: " + ev.Error
	case *covenpb.MessageResponse_Cancelled:
		return "cancelled: " + ev.Cancelled.GetReason()
	}
	return fmt.Sprintf("%T", e.GetEvent())
}

func describeAll(events []*covenpb.MessageResponse) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = describe(e)
	}
	return out
}

// TestGatewayMapping drives the example agent of @agentclientprotocol/sdk
// through the gateway, as a coven agent the runner registered: the
// listing, then a message whose events are checked one by one against
// what the agent sends, through gRPC and then REST with Server-Sent
// Events; then a delete, which deregisters it.
func TestGatewayMapping(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node and the gateway")
	}
	t.Parallel()
	g := startGateway(t, "gw-1")
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_GATEWAY_ADDR": g.GRPCAddr, "CONCLAVE_RUNNER_GATEWAY_TOKEN": gwAgentToken})
	gw := gatewayClient(t, g.GRPCAddr)
	in := r.launchOnGateway(t, "npm-example", "npm-example-on-gateway")

	a := awaitAgent(t, gw, "npm-example-on-gateway", true)
	md := a.GetMetadata()
	if a.GetName() != "the example agent of @agentclientprotocol/sdk" || md.GetHostname() != "runner-test" || md.GetBackend() != "acp" ||
		!slices.Contains(md.GetWorkspaces(), "instance:"+in.ID) || !slices.Contains(a.GetProtocolFeatures(), "cancellation") {
		t.Errorf("the gateway lists %+v", a)
	}

	events := describeAll(send(t, gw, "npm-example-on-gateway", "thread-1", "improve the config", nil))
	const (
		text1 = "I'll help you with that. Let me start by reading some files to understand the current situation."
		text2 = " Now I understand the project structure. I need to make some changes to improve it."
		text3 = " Perfect! I've successfully updated the configuration. The changes have been applied."
	)
	want := []string{
		"text: " + text1,
		`tool_use call_1 Reading project files {"path":"/project/README.md"}`,
		"tool_result call_1 error=false # My Project\n\nThis is a sample project...",
		"text: " + text2,
		`tool_use call_2 Modifying critical configuration file {"path":"/project/config.json","content":"{\"database\": {\"host\": \"new-host\"}}"}`,
		// The permission request, answered at once by the type's policy
		// (allow), is no event: no person was waited for.
		`tool_result call_2 error=false {"success":true,"message":"Configuration updated"}`,
		"text: " + text3,
		"done: " + text1 + text2 + text3,
	}
	if !slices.Equal(events, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
	if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
		t.Errorf("the turn ended %+v", st)
	}
	r.WaitLogWithin(t, in.ID, `gateway request`, time.Minute)

	// REST with Server-Sent Events reaches the same agent.
	req, _ := http.NewRequest("POST", "http://"+g.HTTPAddr+"/v1/agents/npm-example-on-gateway/messages",
		strings.NewReader(`{"thread_id": "thread-1", "content": "and again"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+gwClientToken)
	resp, body := testenv.Do(t, req)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"full_response"`) || !strings.Contains(string(body), "event: end") {
		t.Errorf("SSE: HTTP %d\n%s", resp.StatusCode, body)
	}

	// Deleted, the instance's agent leaves the gateway.
	if code := r.Do(t, "DELETE", "/api/v1/agents/"+in.ID, nil, nil); code != http.StatusOK && code != http.StatusNoContent {
		t.Fatalf("delete: HTTP %d", code)
	}
	awaitAgent(t, gw, "npm-example-on-gateway", false)
}

// TestGatewayCancelAndKill cancels a turn from the gateway (the agent is
// sent session/cancel, the client gets cancelled, the agent takes the next
// message), then kills the agent's process mid-turn: the client gets
// error, not a hang, the agent leaves the gateway, and a prompt that
// resumes the instance registers it again under the same id.
func TestGatewayCancelAndKill(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node and the gateway")
	}
	t.Parallel()
	g := startGateway(t, "gw-1")
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_GATEWAY_ADDR": g.GRPCAddr, "CONCLAVE_RUNNER_GATEWAY_TOKEN": gwAgentToken})
	gw := gatewayClient(t, g.GRPCAddr)
	in := r.launchOnGateway(t, "npm-example", "")
	// Without a name at launch, the agent_id is the instance's.
	awaitAgent(t, gw, in.ID, true)

	var once sync.Once
	events := send(t, gw, in.ID, "", "improve the config", func(requestID string, e *covenpb.MessageResponse) {
		if _, ok := e.GetEvent().(*covenpb.MessageResponse_Text); ok {
			once.Do(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := gw.CancelMessage(ctx, &gatewayv1.CancelMessageRequest{RequestId: requestID, Reason: "changed my mind"}); err != nil {
					t.Errorf("CancelMessage: %v", err)
				}
			})
		}
	})
	if last := describe(events[len(events)-1]); last != "cancelled: changed my mind" {
		t.Fatalf("a cancelled request ended %q; events %q", last, describeAll(events))
	}
	r.WaitLogWithin(t, in.ID, "cancel requested: changed my mind", time.Minute)
	if st := r.WaitStatus(t, in.ID, "stopped", "failed", "completed"); st.Status != "stopped" {
		t.Fatalf("after the cancel %+v", st)
	}
	if last := describe(lastOf(send(t, gw, in.ID, "", "once more", nil))); !strings.HasPrefix(last, "done: ") {
		t.Fatalf("the message after the cancel ended %q", last)
	}

	st := r.Status(t, in.ID)
	pid, err := strconv.Atoi(st.ContainerID)
	if err != nil {
		t.Fatalf("container_id %q is not a process id", st.ContainerID)
	}
	var killOnce sync.Once
	events = send(t, gw, in.ID, "", "improve the config", func(_ string, e *covenpb.MessageResponse) {
		if _, ok := e.GetEvent().(*covenpb.MessageResponse_Text); ok {
			killOnce.Do(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		}
	})
	if last := describe(lastOf(events)); !strings.HasPrefix(last, "error: ") {
		t.Fatalf("a request whose agent was killed ended %q", last)
	}
	awaitAgent(t, gw, in.ID, false)

	// A prompt resumes the instance in a new process, registered again
	// under the same id.
	var ok struct{ Accepted bool }
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "back"}, &ok); code != http.StatusOK {
		t.Fatalf("prompt: HTTP %d", code)
	}
	r.WaitStatus(t, in.ID, "completed")
	awaitAgent(t, gw, in.ID, true)
	if last := describe(lastOf(send(t, gw, in.ID, "", "are you back?", nil))); !strings.HasPrefix(last, "done: ") {
		t.Fatalf("the resumed agent's message ended %q", last)
	}
}

func lastOf(events []*covenpb.MessageResponse) *covenpb.MessageResponse { return events[len(events)-1] }

// TestGatewayReplicas runs two gateway replicas on one store (dynalite)
// behind a load balancer (nginx), and the runner's agent registered
// through it. The replica holding the agent is stopped mid-turn:
//   - gracefully (SIGTERM): its Shutdown lets the turn end, so the client
//     gets done, and the agent registers again on the other replica;
//   - killed (SIGKILL): the client's request fails (UNAVAILABLE) as the
//     gateway says of an agent gone, the turn is not lost (it ends
//     completed in the runner), and once the dead replica's lease has
//     expired the agent is registered again, under the same id, on the
//     other replica, and answers.
func TestGatewayReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs node, dynalite, nginx and two gateways")
	}
	t.Parallel()
	ctx := context.Background()
	dyn := testenv.DynaliteFor(t)
	for _, tt := range []struct {
		name   string
		signal syscall.Signal
	}{
		{"shutdown", syscall.SIGTERM},
		{"killed", syscall.SIGKILL},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := []string{"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT=" + dyn.Endpoint, "CONCLAVE_TABLE_PREFIX=" + tt.name + "-",
				"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1", "CONCLAVE_GATEWAY_LEASE=2s"}
			replicas := map[string]*gatewayProc{"gw-a": startGateway(t, "gw-a", env...), "gw-b": startGateway(t, "gw-b", env...)}
			lb, err := testenv.NginxGRPC(ctx, t.TempDir(), []string{replicas["gw-a"].GRPCAddr, replicas["gw-b"].GRPCAddr}, "2s")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(lb.Stop)
			r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_GATEWAY_ADDR": lb.Addr, "CONCLAVE_RUNNER_GATEWAY_TOKEN": gwAgentToken})
			const id = "moving-agent"
			in := r.launchOnGateway(t, "npm-example", id)
			holder := awaitAgent(t, gatewayClient(t, lb.Addr), id, true).GetServerId()
			var survivor *gatewayProc
			for name, g := range replicas {
				if name != holder {
					survivor = g
				}
			}
			if survivor == nil {
				t.Fatalf("the agent is held by %q, not one of the replicas", holder)
			}

			// The message goes straight to the holder, so that the one
			// replica stopped is the one the request is on.
			holderGW := gatewayClient(t, replicas[holder].GRPCAddr)
			sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
			defer cancel()
			st, err := holderGW.SendMessage(sctx, &gatewayv1.SendMessageRequest{AgentId: id, Content: "improve the config"})
			if err != nil {
				t.Fatal(err)
			}
			var (
				events  []string
				endErr  error
				stopped bool
			)
			for {
				m, err := st.Recv()
				if err != nil {
					endErr = err
					break
				}
				if e := m.GetEvent(); e != nil {
					events = append(events, describe(e))
					if !stopped {
						stopped = true
						_ = replicas[holder].Cmd.Process.Signal(tt.signal)
					}
					if _, done := e.GetEvent().(*covenpb.MessageResponse_Done); done {
						break
					}
				}
			}
			switch tt.signal {
			case syscall.SIGTERM:
				if endErr != nil || len(events) == 0 || !strings.HasPrefix(events[len(events)-1], "done: ") {
					t.Fatalf("a request on a replica shutting down ended %v; events %q\n%s", endErr, events, replicas[holder].Out.String())
				}
			case syscall.SIGKILL:
				if endErr == nil {
					t.Fatalf("a request on a killed replica ended without an error; events %q", events)
				}
			}
			// The turn itself went on in the runner.
			if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
				t.Fatalf("the turn ended %+v", st)
			}
			<-replicas[holder].Done
			a := awaitAgent(t, gatewayClient(t, survivor.GRPCAddr), id, true)
			if a.GetServerId() != survivor.ID {
				t.Fatalf("registered again on %q, want %q", a.GetServerId(), survivor.ID)
			}
			if last := describe(lastOf(send(t, gatewayClient(t, lb.Addr), id, "", "still there?", nil))); !strings.HasPrefix(last, "done: ") {
				t.Fatalf("after the move, a message ended %q", last)
			}
			r.WaitLogWithin(t, in.ID, "registered at the gateway as coven agent moving-agent (replica "+survivor.ID+")", time.Minute)
		})
	}
}

// TestGatewayResumedWithSessionLoad: an agent that idles out leaves the
// gateway with its process; a prompt resumes the instance in a new
// process with session/load, and it registers again under the same id and
// answers through the gateway in the loaded session.
func TestGatewayResumedWithSessionLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes and the gateway")
	}
	t.Parallel()
	g := startGateway(t, "gw-1")
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_GATEWAY_ADDR": g.GRPCAddr, "CONCLAVE_RUNNER_GATEWAY_TOKEN": gwAgentToken,
		"CONCLAVE_RUNNER_IDLE_TIMEOUT": "2s"})
	gw := gatewayClient(t, g.GRPCAddr)
	in := r.launchOnGateway(t, "acp-normal", "resumable")
	awaitAgent(t, gw, "resumable", true)
	if last := describe(lastOf(send(t, gw, "resumable", "", "first", nil))); !strings.HasPrefix(last, "done: Working on: first") {
		t.Fatalf("the first message ended %q", last)
	}
	var sess struct {
		SessionID string `json:"session_id"`
	}
	r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/session", nil, &sess)
	// Idle for 2s: the process ends, and the agent leaves the gateway.
	r.WaitLogWithin(t, in.ID, "idle for 2s", time.Minute)
	awaitAgent(t, gw, "resumable", false)

	var ok struct{ Accepted bool }
	if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "resume"}, &ok); code != http.StatusOK {
		t.Fatalf("prompt: HTTP %d", code)
	}
	r.WaitLogWithin(t, in.ID, "acp-agent: loaded session "+sess.SessionID, time.Minute)
	awaitAgent(t, gw, "resumable", true)
	r.WaitStatus(t, in.ID, "completed")
	if last := describe(lastOf(send(t, gw, "resumable", "", "second", nil))); !strings.HasPrefix(last, "done: Working on: second") {
		t.Fatalf("the resumed agent's message ended %q", last)
	}
}

// TestGatewayRefusal: a gateway that refuses the runner's token, or an
// id listed with a token of its own, is not retried; the instance's log
// says so, and the instance works on through the runner's API.
func TestGatewayRefusal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes and the gateway")
	}
	t.Parallel()
	// "listed" has a token of its own: the pattern's token cannot open it.
	g := startGateway(t, "gw-1", "CONCLAVE_GATEWAY_AGENT_TOKENS=listed=listed-agent-secret-0123456789,*="+gwAgentToken)
	for _, tt := range []struct {
		name, token, agentID, want string
	}{
		{"wrong token", "not-the-runner-token-0123456789", "", "the gateway refused the agent: invalid token"},
		{"an id with a token of its own", gwAgentToken, "listed", `the gateway refused the agent: invalid token for agent "listed"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_GATEWAY_ADDR": g.GRPCAddr, "CONCLAVE_RUNNER_GATEWAY_TOKEN": tt.token})
			in := r.launchOnGateway(t, "acp-normal", tt.agentID)
			r.WaitLogWithin(t, in.ID, tt.want, time.Minute)
			var ok struct{ Accepted bool }
			if code := r.Do(t, "POST", "/api/v1/agents/"+in.ID+"/prompt", map[string]string{"message": "still here"}, &ok); code != http.StatusOK {
				t.Fatalf("prompt: HTTP %d", code)
			}
			r.WaitLogWithin(t, in.ID, "Working on: still here", time.Minute)
		})
	}
}

// TestGatewayHeartbeat: behind a gateway that drops agents silent for 3s
// (CONCLAVE_GATEWAY_AGENT_TIMEOUT), an idle runner agent heartbeating
// every second keeps its one connection.
func TestGatewayHeartbeat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs agent processes and the gateway")
	}
	t.Parallel()
	g := startGateway(t, "gw-1", "CONCLAVE_GATEWAY_AGENT_TIMEOUT=3s")
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_GATEWAY_ADDR": g.GRPCAddr, "CONCLAVE_RUNNER_GATEWAY_TOKEN": gwAgentToken,
		"CONCLAVE_RUNNER_GATEWAY_HEARTBEAT": "1s"})
	gw := gatewayClient(t, g.GRPCAddr)
	in := r.launchOnGateway(t, "npm-example", "")
	first := awaitAgent(t, gw, in.ID, true).GetInstanceId()
	// Two agent timeouts, idle.
	time.Sleep(6 * time.Second)
	if now := awaitAgent(t, gw, in.ID, true).GetInstanceId(); now != first {
		t.Fatalf("the agent's connection changed from %s to %s: the gateway dropped it as silent", first, now)
	}
	registrations := 0
	for _, l := range r.Logs(t, in.ID) {
		if strings.Contains(l.Text, "registered at the gateway as coven agent") {
			registrations++
		}
	}
	if registrations != 1 {
		t.Fatalf("the agent registered %d times, want once: %+v", registrations, r.Logs(t, in.ID))
	}
}
