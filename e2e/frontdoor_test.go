package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// stepFrontDoor: one request through all five services. The runner
// launches the front-door agent (an ACP agent under the librarian policy,
// registered at the gateway); a client sends it one message through the
// gateway's gRPC client API; the agent asks permission for its tool call,
// which the Librarian's rules approve, calls the bridge's label tool over
// MCP, writes the labels into notes.txt, and answers with them; a
// subscriber of task:{task_id} sees the turn's progress. One trace, the
// client's: the gateway's SendMessage, the runner's turn and its Librarian
// approval, the Librarian's spans, the bridge's, and the bus's publishing
// and delivery of the turn's events.
func stepFrontDoor(r *stepRun) {
	sh := r.sh
	u := unique()
	taskID := "e2e-front-door-" + u
	// A workspace of its own: its notes.txt is the tool's effect (where
	// this host sees it).
	workspace := filepath.Join(sh.workspace, taskID)
	if !sh.agentsRemote {
		if err := os.MkdirAll(workspace, 0o755); err != nil {
			r.t.Fatal(err)
		}
	}
	sub := r.dialBus(r.ctx, "e2e-front-door-watcher-"+u, false, nil)
	sub.subscribe(r, r.ctx, "task:"+taskID)

	var inst struct {
		ID string `json:"id"`
	}
	if status, body := r.do(r.ctx, http.MethodPost, sh.runnerHTTP+"/api/v1/agents/launch", sh.runnerToken, map[string]any{
		"task_id": taskID, "agent_type": frontDoorAgentType, "workspace_path": workspace,
	}, &inst); status/100 != 2 || inst.ID == "" {
		r.t.Fatalf("launch: %d %s", status, body)
	}
	defer r.explainInstance(inst.ID)
	agentURL := sh.gatewayHTTP + "/v1/agents/" + inst.ID
	r.waitFor("the runner's agent to register at the gateway", func() string {
		if status, body := r.do(r.ctx, http.MethodGet, agentURL, sh.gatewayToken, nil, nil); status != http.StatusOK {
			return fmt.Sprintf("GET %s: %d %s", agentURL, status, body)
		}
		return ""
	})

	ctx, root := r.root("step 8: one request through all five")
	traceID := root.SpanContext().TraceID().String()
	conn, err := grpc.NewClient(sh.gatewayGRPC, append(r.tel.GRPCDialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close()
	if sh.gatewayToken != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+sh.gatewayToken)
	}
	const question = "label issue 27"
	stream, err := gatewayv1.NewGatewayServiceClient(conn).SendMessage(ctx, &gatewayv1.SendMessageRequest{
		AgentId: inst.ID, Sender: "e2e", Content: question,
	})
	if err != nil {
		r.t.Fatalf("SendMessage: %v", err)
	}
	var (
		text, full      string
		toolUses, kinds []string
		toolResult      string
	)
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			r.t.Fatalf("SendMessage's stream: %v (so far %v)", err, kinds)
		}
		ev := resp.GetEvent()
		switch {
		case ev.GetEvent() == nil:
			// The thread's and request's ids alone.
		case ev.GetText() != "":
			kinds = append(kinds, "text")
			text += ev.GetText()
		case ev.GetToolUse() != nil:
			kinds = append(kinds, "tool_use")
			toolUses = append(toolUses, ev.GetToolUse().GetName())
		case ev.GetToolResult() != nil:
			kinds = append(kinds, "tool_result")
			if ev.GetToolResult().GetIsError() {
				r.t.Errorf("tool_result is an error: %s", ev.GetToolResult().GetOutput())
			}
			if strings.Contains(ev.GetToolResult().GetOutput(), "labels") {
				toolResult = ev.GetToolResult().GetOutput()
			}
		case ev.GetDone() != nil:
			kinds = append(kinds, "done")
			full = ev.GetDone().GetFullResponse()
		case ev.GetError() != "":
			r.t.Fatalf("the agent answered error: %s (so far %v)", ev.GetError(), kinds)
		default:
			kinds = append(kinds, fmt.Sprintf("%T", ev.GetEvent()))
		}
	}
	r.t.Logf("the client got %v", kinds)
	if full == "" || full != text || !strings.Contains(full, "Working on: "+question) || !strings.Contains(full, frontDoorTool+": ") {
		r.t.Errorf("done's full_response %q (the text was %q)", full, text)
	}
	if !slices.Contains(toolUses, frontDoorTool) {
		r.t.Errorf("no tool_use of %s: %v", frontDoorTool, toolUses)
	}
	answered := labels(full)
	if len(answered) == 0 || !slices.Equal(answered, labels(toolResult)) {
		r.t.Errorf("the answer's labels %v, the tool_result's %v (%q)", answered, labels(toolResult), toolResult)
	}
	// The tool's effect: the labels it gave, in the file the permission
	// request was for. An agent in a Job's pod writes it there (its
	// tool_result and answer above hold the labels).
	if !sh.agentsRemote {
		notes, err := os.ReadFile(filepath.Join(workspace, "notes.txt"))
		if err != nil || !slices.Equal(labels(string(notes)), answered) {
			r.t.Errorf("notes.txt: %v %q; want the labels %v", err, notes, answered)
		}
	}

	// The turn's progress on task:{task_id}, in the client's trace.
	var seenTool, seenDone bool
	for !seenTool || !seenDone {
		d := sub.next(r, fmt.Sprintf("the turn's events on task:%s (tool call seen %v, completed %v)", taskID, seenTool, seenDone),
			func(d delivery) bool { return d.Topic == "task:"+taskID })
		if d.traceID != traceID {
			continue // the launch's own events, in the launch's trace
		}
		var ev struct {
			Type string `json:"type"`
			Data struct {
				Value struct {
					Kind   string `json:"kind"`
					Status string `json:"status"`
					Update string `json:"update"`
				} `json:"value"`
			} `json:"data"`
		}
		if err := json.Unmarshal(d.Payload, &ev); err != nil {
			r.t.Fatalf("event %s: %v", d.Payload, err)
		}
		switch {
		case ev.Type == "runner.session.update" && ev.Data.Value.Kind == "tool_call" && strings.Contains(ev.Data.Value.Update, frontDoorTool):
			seenTool = true
		case ev.Type == "runner.task.status_changed" && ev.Data.Value.Status == "completed":
			seenDone = true
		case ev.Type == "runner.task.status_changed" && (ev.Data.Value.Status == "failed" || ev.Data.Value.Status == "stopped"):
			r.t.Fatalf("the turn ended %s: %s", ev.Data.Value.Status, d.Payload)
		}
	}
	root.End()
	r.expectTrace(root, spanOf(gateway, "conclave.gateway.v1.GatewayService/SendMessage"), spanOf(runner, "gateway message turn"),
		spanOf(runner, "librarian approval"), in(librarian), in(bridge), spanOf(bus, "bus-events process"), spanOf(bus, "bus deliver sendMessage"))
}
