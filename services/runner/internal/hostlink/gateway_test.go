package hostlink

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/covenlink"
)

// fakeGateway is a coven gateway's AgentStream, for tests of agent-host's
// registration: it welcomes (or refuses) each registration, and hands the
// test each registered stream to drive.
type fakeGateway struct {
	covenpb.UnimplementedCovenControlServer
	addr    string
	refuse  codes.Code
	streams chan *fakeAgentStream

	mu   sync.Mutex
	regs []*covenpb.RegisterAgent
}

// fakeAgentStream is one registered AgentStream.
type fakeAgentStream struct {
	reg   *covenpb.RegisterAgent
	token string
	send  chan *covenpb.ServerMessage
	// events are the agent's MessageResponses, in order.
	events chan *covenpb.MessageResponse
	// kill ends the stream with the status, as a replica that dies.
	kill chan codes.Code
	gone chan struct{}
}

func startFakeGateway(t *testing.T, refuse codes.Code) *fakeGateway {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGateway{addr: lis.Addr().String(), refuse: refuse, streams: make(chan *fakeAgentStream, 16)}
	srv := grpc.NewServer()
	covenpb.RegisterCovenControlServer(srv, g)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return g
}

func (g *fakeGateway) AgentStream(stream covenpb.CovenControl_AgentStreamServer) error {
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	reg := m.GetRegister()
	if reg == nil {
		return status.Error(codes.InvalidArgument, "the first message must be a RegisterAgent")
	}
	g.mu.Lock()
	g.regs = append(g.regs, reg)
	g.mu.Unlock()
	if g.refuse != codes.OK {
		return status.Error(g.refuse, "refused by the test")
	}
	md, _ := metadata.FromIncomingContext(stream.Context())
	token := ""
	if v := md.Get("authorization"); len(v) > 0 {
		token = strings.TrimPrefix(v[0], "Bearer ")
	}
	if err := stream.Send(&covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Welcome{Welcome: &covenpb.Welcome{
		ServerId: "fake-replica", AgentId: reg.GetAgentId()}}}); err != nil {
		return err
	}
	fs := &fakeAgentStream{reg: reg, token: token, send: make(chan *covenpb.ServerMessage, 8),
		events: make(chan *covenpb.MessageResponse, 256), kill: make(chan codes.Code, 1), gone: make(chan struct{})}
	go func() {
		defer close(fs.gone)
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if r := m.GetResponse(); r != nil {
				fs.events <- r
			}
		}
	}()
	g.streams <- fs
	for {
		select {
		case m := <-fs.send:
			if err := stream.Send(m); err != nil {
				return err
			}
		case c := <-fs.kill:
			return status.Error(c, "the replica died")
		case <-fs.gone:
			return nil
		}
	}
}

func (g *fakeGateway) registrations() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.regs)
}

// next is the next registered stream.
func (g *fakeGateway) next(t *testing.T, what string) *fakeAgentStream {
	t.Helper()
	select {
	case fs := <-g.streams:
		return fs
	case <-time.After(time.Minute):
		t.Fatalf("waiting for %s: no registration at the gateway after a minute (%d refused or ended)", what, g.registrations())
		return nil
	}
}

// message sends a SendMessage and returns the request's events up to its
// last (done, error or cancelled); onEvent, if set, sees each first.
func (fs *fakeAgentStream) message(t *testing.T, id, content string, onEvent func(*covenpb.MessageResponse)) []*covenpb.MessageResponse {
	t.Helper()
	fs.send <- &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_SendMessage{SendMessage: &covenpb.SendMessage{
		RequestId: id, Content: content, ThreadId: "thread-1", Sender: "test"}}}
	var got []*covenpb.MessageResponse
	deadline := time.After(time.Minute)
	for {
		select {
		case e := <-fs.events:
			if e.GetRequestId() != id {
				t.Fatalf("an event of request %q, want %q", e.GetRequestId(), id)
			}
			got = append(got, e)
			if onEvent != nil {
				onEvent(e)
			}
			switch e.GetEvent().(type) {
			case *covenpb.MessageResponse_Done, *covenpb.MessageResponse_Error, *covenpb.MessageResponse_Cancelled:
				return got
			}
		case <-deadline:
			t.Fatalf("waiting for the end of request %s: not after a minute; events so far %v", id, got)
		}
	}
}

// gatewayRunner is the runner's side of a launch whose agent-host
// registers the agent at the gateway: a gateway message becomes the next
// turn, run over the link, whose end is told back as the runner records
// it.
type gatewayRunner struct {
	link *Link
	turn atomic.Int64
	// refuse, when set, is why messages are not taken.
	refuse error
}

func (r *gatewayRunner) options(rec *recorder) LinkOptions {
	o := rec.options()
	o.OnGatewayMessage = func(ctx context.Context, content string, accepted func(int)) error {
		if r.refuse != nil {
			return r.refuse
		}
		turn := int(r.turn.Add(1))
		accepted(turn)
		go func() {
			t, err := r.link.PromptTurn(context.WithoutCancel(ctx), int64(turn), content, acceptTimeout)
			end, why := covenlink.EndCompleted, ""
			switch {
			case err != nil:
				end, why = covenlink.EndFailed, err.Error()
			case t.StopReason == acp.StopCancelled:
				end = covenlink.EndStopped
			}
			r.link.GatewayTurnEnded(turn, end, why)
		}()
		return nil
	}
	o.OnGatewayCancel = func(reason string) { _ = r.link.CancelTurn(context.Background(), reason, 0) }
	return o
}

func kinds(events []*covenpb.MessageResponse) []string {
	var out []string
	for _, e := range events {
		switch e.GetEvent().(type) {
		case *covenpb.MessageResponse_Text:
			out = append(out, "text")
		case *covenpb.MessageResponse_ToolUse:
			out = append(out, "tool_use")
		case *covenpb.MessageResponse_ToolResult:
			out = append(out, "tool_result")
		case *covenpb.MessageResponse_ToolState:
			out = append(out, "tool_state")
		case *covenpb.MessageResponse_Done:
			out = append(out, "done")
		case *covenpb.MessageResponse_Error:
			out = append(out, "error")
		case *covenpb.MessageResponse_Cancelled:
			out = append(out, "cancelled")
		}
	}
	return out
}

// agent-host registers its agent at the gateway once the agent's session
// is up, under the launch's agent_id with the type's capabilities and its
// token; a message there becomes a turn the runner stores, whose updates
// reach the gateway mapped to coven events. A replica that dies has the
// agent register again under the same id; a refused registration is not
// retried; a message the runner does not take ends with error; a cancel
// from the gateway ends the turn cancelled.
func TestGatewayRegistration(t *testing.T) {
	integration(t)
	const token = "gateway-token-of-the-operator"
	for _, tt := range []struct {
		name string
		mode string
		// runnerRefuses: the runner does not take gateway messages.
		runnerRefuses error
		run           func(t *testing.T, gw *fakeGateway, fs *fakeAgentStream, rec *recorder)
	}{
		{name: "registers and answers", mode: "normal", run: func(t *testing.T, gw *fakeGateway, fs *fakeAgentStream, _ *recorder) {
			events := fs.message(t, "req-1", "hello", nil)
			k := kinds(events)
			if k[len(k)-1] != "done" || !slices.Contains(k, "text") || !slices.Contains(k, "tool_use") {
				t.Fatalf("events %v, want text and tool_use, then done", k)
			}
			if full := events[len(events)-1].GetDone().GetFullResponse(); !strings.Contains(full, "Working on: hello") {
				t.Fatalf("full response %q", full)
			}
			// A second message is the next turn.
			if k := kinds(fs.message(t, "req-2", "again", nil)); k[len(k)-1] != "done" {
				t.Fatalf("second message: %v", k)
			}
		}},
		{name: "registers again after its replica dies", mode: "normal", run: func(t *testing.T, gw *fakeGateway, fs *fakeAgentStream, _ *recorder) {
			fs.kill <- codes.Unavailable
			again := gw.next(t, "the registration after the replica died")
			if again.reg.GetAgentId() != fs.reg.GetAgentId() || again.token != token {
				t.Fatalf("registered again as %q with token %q", again.reg.GetAgentId(), again.token)
			}
			if k := kinds(again.message(t, "req-after", "hello", nil)); k[len(k)-1] != "done" {
				t.Fatalf("after re-registering: %v", k)
			}
		}},
		{name: "the runner does not take the message", mode: "normal", runnerRefuses: errors.New("instance busy: a turn is in progress"),
			run: func(t *testing.T, gw *fakeGateway, fs *fakeAgentStream, _ *recorder) {
				events := fs.message(t, "req-busy", "hello", nil)
				if e := events[len(events)-1].GetError(); !strings.Contains(e, "a turn is in progress") {
					t.Fatalf("events %v, want an error saying why", kinds(events))
				}
			}},
		{name: "cancel from the gateway", mode: "slow-tool", run: func(t *testing.T, gw *fakeGateway, fs *fakeAgentStream, _ *recorder) {
			cancelled := false
			events := fs.message(t, "req-cancel", "hello", func(e *covenpb.MessageResponse) {
				if e.GetToolUse() != nil && !cancelled {
					cancelled = true
					fs.send <- &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_CancelRequest{CancelRequest: &covenpb.CancelRequest{
						RequestId: "req-cancel", Reason: proto.String("the client gave up")}}}
				}
			})
			if c := events[len(events)-1].GetCancelled(); c == nil || c.GetReason() != "the client gave up" {
				t.Fatalf("events %v, want cancelled with the client's reason", kinds(events))
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gw := startFakeGateway(t, codes.OK)
			rig := startHub(t, "")
			rec := newRecorder()
			r := &gatewayRunner{refuse: tt.runnerRefuses}
			instance := "inst-gw-" + strings.ReplaceAll(tt.name, " ", "-")
			r.link = rig.hub.Expect(instance, 1, r.options(rec))
			startHost(t, hostSpec{addr: rig.addr, instance: instance, workspace: t.TempDir(),
				env: map[string]string{
					"CONCLAVE_AGENT_HOST_GATEWAY_ADDR":         gw.addr,
					"CONCLAVE_AGENT_HOST_GATEWAY_TOKEN":        token,
					"CONCLAVE_AGENT_HOST_GATEWAY_AGENT_ID":     "front-" + instance,
					"CONCLAVE_AGENT_HOST_GATEWAY_NAME":         "Front door",
					"CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES": "chat,code",
					"CONCLAVE_AGENT_HOST_AGENT_TYPE":           "acp-example",
				},
				agent: []string{acpAgentBin, "-dialect", "acp", "-mode", tt.mode}})
			awaitReady(t, r.link)
			fs := gw.next(t, "the agent's registration")
			reg := fs.reg
			if reg.GetAgentId() != "front-"+instance || reg.GetName() != "Front door" || !slices.Equal(reg.GetCapabilities(), []string{"chat", "code"}) || fs.token != token {
				t.Fatalf("registered %+v with token %q", reg, fs.token)
			}
			md := reg.GetMetadata()
			if !slices.Equal(md.GetWorkspaces(), []string{"runner", "instance:" + instance, "agent_type:acp-example"}) || md.GetHostname() == "" || md.GetBackend() != "acp" {
				t.Fatalf("metadata %+v", md)
			}
			// The runner's log says where it registered.
			rec.waitFor(t, "the registration in the instance's log", func(_ []acp.Update, logs []string) bool {
				return slices.ContainsFunc(logs, func(l string) bool {
					return strings.Contains(l, "registered at the gateway as coven agent front-"+instance)
				})
			})
			tt.run(t, gw, fs, rec)
		})
	}
}

// A gateway that refuses the agent's token is not asked again: the
// instance's log says so, and the agent goes on for the runner.
func TestGatewayRefused(t *testing.T) {
	integration(t)
	gw := startFakeGateway(t, codes.Unauthenticated)
	rig := startHub(t, "")
	rec := newRecorder()
	r := &gatewayRunner{}
	r.link = rig.hub.Expect("inst-gw-refused", 1, r.options(rec))
	startHost(t, hostSpec{addr: rig.addr, instance: "inst-gw-refused", workspace: t.TempDir(),
		env:   map[string]string{"CONCLAVE_AGENT_HOST_GATEWAY_ADDR": gw.addr, "CONCLAVE_AGENT_HOST_GATEWAY_TOKEN": "wrong"},
		agent: []string{acpAgentBin, "-dialect", "acp"}})
	rec.waitFor(t, "the refusal in the instance's log", func(_ []acp.Update, logs []string) bool {
		return slices.ContainsFunc(logs, func(l string) bool { return strings.Contains(l, "the gateway refused the agent") })
	})
	// The agent still answers the runner; by then a retry would have
	// registered again.
	if turn, err := r.link.PromptTurn(t.Context(), 1, "hello", acceptTimeout); err != nil || turn.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", turn, err)
	}
	if n := gw.registrations(); n != 1 {
		t.Fatalf("%d registrations, want the one refused", n)
	}
}

// A permission request that waits for a person reaches the gateway
// through agent-host's registration, as the runner tells it: the gateway
// request sees its tool call awaiting approval while the person decides,
// then the decision's state, then the turn's end. This is the runner's own
// word on the tool call, which only the runner knows (it asks the
// Librarian), so it travels over the link as a command.
func TestGatewayToolState(t *testing.T) {
	integration(t)
	for _, tt := range []struct {
		name     string
		allow    bool
		decision string
		state    covenpb.ToolState
		// after is the agent's own last word on its tool call.
		after covenpb.ToolState
	}{
		{"approved", true, "approved", covenpb.ToolState_TOOL_STATE_RUNNING, covenpb.ToolState_TOOL_STATE_COMPLETED},
		{"rejected", false, "rejected", covenpb.ToolState_TOOL_STATE_DENIED, covenpb.ToolState_TOOL_STATE_FAILED},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gw := startFakeGateway(t, codes.OK)
			rig := startHub(t, "")
			r := &gatewayRunner{}
			opts := r.options(newRecorder())
			// The person decides once the gateway has seen the wait.
			seen := make(chan struct{})
			opts.OnPermission = func(ctx context.Context, req PermissionRequest) acp.PermissionAnswer {
				var params struct {
					ToolCall struct {
						ToolCallID string `json:"toolCallId"`
					} `json:"toolCall"`
				}
				_ = json.Unmarshal(req.Params, &params)
				id := params.ToolCall.ToolCallID
				r.link.GatewayToolState(int(req.Turn), id, covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL, "waiting for a person")
				select {
				case <-seen:
				case <-ctx.Done():
					return acp.PermissionAnswer{Meta: map[string]any{"decision": "cancelled"}}
				}
				r.link.GatewayToolState(int(req.Turn), id, tt.state, "permission "+tt.decision)
				return acp.PermissionAnswer{Allow: tt.allow, Meta: map[string]any{"decision": tt.decision}}
			}
			instance := "inst-gw-tool-state-" + tt.name
			r.link = rig.hub.Expect(instance, 1, opts)
			startHost(t, hostSpec{addr: rig.addr, instance: instance, workspace: t.TempDir(),
				env: map[string]string{
					"CONCLAVE_AGENT_HOST_GATEWAY_ADDR":  gw.addr,
					"CONCLAVE_AGENT_HOST_GATEWAY_TOKEN": "gateway-token",
					"CONCLAVE_AGENT_HOST_PERMISSION":    "librarian",
				},
				agent: []string{acpAgentBin, "-dialect", "acp"}})
			if _, err := r.link.Ready(t.Context()); err != nil {
				t.Fatal(err)
			}
			fs := gw.next(t, "the agent's registration")
			var states []string
			events := fs.message(t, "req-perm", "write the notes", func(e *covenpb.MessageResponse) {
				ts := e.GetToolState()
				if ts == nil {
					return
				}
				states = append(states, ts.GetId()+" "+ts.GetState().String()+": "+ts.GetDetail())
				if ts.GetState() == covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL {
					close(seen)
				}
			})
			want := []string{
				"call_1 TOOL_STATE_AWAITING_APPROVAL: waiting for a person",
				"call_1 " + tt.state.String() + ": permission " + tt.decision,
				"call_1 " + tt.after.String() + ": ",
			}
			if !slices.Equal(states, want) {
				t.Fatalf("tool states %q, want %q (events %v)", states, want, kinds(events))
			}
			if k := kinds(events); k[len(k)-1] != "done" {
				t.Fatalf("events %v, want done last", k)
			}
		})
	}
}
