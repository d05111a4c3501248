package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	"github.com/a2aproject/a2a-go/v2/a2acompat/a2av0"
	"google.golang.org/grpc"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// a2aAgent is a coven agent for the A2A tests. It declares cancellation.
// To "hold" it answers "working" and waits until the request is cancelled
// (it answers cancelled) or released (text "released", then done); to
// "fail" it answers an error; to anything else it thinks, uses a tool,
// and echoes the content in two text chunks, then done.
type a2aAgent struct {
	serverID string // the replica holding it
	release  chan struct{}
	holding  chan string // request ids of held messages

	mu       sync.Mutex
	held     map[string]chan struct{} // a held request's cancel
	spurious []string                 // cancel requests for requests not held
}

// strayCancels are the cancel requests the agent got for requests it was
// not holding (it had ended them).
func (a *a2aAgent) strayCancels() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.spurious...)
}

func startA2AAgent(t *testing.T, ctx context.Context, conn *grpc.ClientConn, id string, withToken bool) *a2aAgent {
	t.Helper()
	a := &a2aAgent{release: make(chan struct{}), holding: make(chan string, 16), held: map[string]chan struct{}{}}
	sctx := ctx
	if withToken {
		sctx = withAgentToken(ctx, id)
	}
	stream, err := covenpb.NewCovenControlClient(conn).AgentStream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
		AgentId: id, Name: "A2A test agent", Capabilities: []string{"chat", "code"}, ProtocolFeatures: []string{"cancellation"},
	}}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || m.GetWelcome() == nil {
		t.Fatalf("register %s: %v %v", id, m, err)
	}
	a.serverID = m.GetWelcome().GetServerId()
	var mu sync.Mutex
	send := func(r *covenpb.MessageResponse) {
		mu.Lock()
		defer mu.Unlock()
		_ = stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}})
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if c := m.GetCancelRequest(); c != nil {
				a.mu.Lock()
				if ch, ok := a.held[c.GetRequestId()]; ok {
					close(ch)
					delete(a.held, c.GetRequestId())
				} else {
					a.spurious = append(a.spurious, c.GetRequestId())
				}
				a.mu.Unlock()
				continue
			}
			req := m.GetSendMessage()
			if req == nil {
				continue
			}
			id := req.GetRequestId()
			switch req.GetContent() {
			case "hold":
				send(&covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: "working"}})
				cancelled := make(chan struct{})
				a.mu.Lock()
				a.held[id] = cancelled
				a.mu.Unlock()
				a.holding <- id
				go func() {
					defer func() {
						a.mu.Lock()
						delete(a.held, id)
						a.mu.Unlock()
					}()
					select {
					case <-cancelled:
						send(&covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Cancelled{Cancelled: &covenpb.Cancelled{Reason: "stopped"}}})
					case <-a.release:
						send(&covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: " released"}})
						send(&covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}})
					case <-ctx.Done():
					}
				}()
			case "fail":
				send(&covenpb.MessageResponse{RequestId: id, Event: &covenpb.MessageResponse_Error{Error: "boom"}})
			default:
				for _, r := range []*covenpb.MessageResponse{
					{RequestId: id, Event: &covenpb.MessageResponse_Thinking{Thinking: "hmm"}},
					{RequestId: id, Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{Id: "t1", Name: "search", InputJson: `{"q":"x"}`}}},
					{RequestId: id, Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{Id: "t1", Output: "found"}}},
					{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: "echo: "}},
					{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: req.GetContent()}},
					{RequestId: id, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "echo: " + req.GetContent()}}},
				} {
					send(r)
				}
			}
		}
	}()
	return a
}

func tokenClient(tok string) *http.Client {
	return &http.Client{Transport: testenv.Bearer{Token: tok, Next: http.DefaultTransport}, Timeout: 2 * time.Minute}
}

// a2aClient resolves agentID's card at base and returns a2a-go's client for
// it, over JSON-RPC, with tok (0.3's JSON-RPC when v0).
func a2aClient(t *testing.T, ctx context.Context, base, agentID, tok string, v0 bool) *a2aclient.Client {
	t.Helper()
	card, err := agentcard.NewResolver(nil).Resolve(ctx, base+"/a2a/"+agentID, agentcard.WithRequestHeader("Authorization", "Bearer "+tok))
	if err != nil {
		t.Fatalf("resolving %s's card: %v", agentID, err)
	}
	var client *a2aclient.Client
	if v0 {
		client, err = a2aclient.NewFromEndpoints(ctx, []*a2a.AgentInterface{card.SupportedInterfaces[1]},
			a2av0.WithJSONRPCTransport(a2av0.JSONRPCTransportConfig{Client: tokenClient(tok)}))
	} else {
		client, err = a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(tokenClient(tok)))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Destroy() })
	return client
}

func textMessage(text string) *a2a.SendMessageRequest {
	return &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))}
}

// artifactText is the text of a task's artifact "response".
func artifactText(task *a2a.Task) string {
	var b strings.Builder
	for _, a := range task.Artifacts {
		if a.ID == "response" {
			for _, p := range a.Parts {
				b.WriteString(p.Text())
			}
		}
	}
	return b.String()
}

// describe is a stream's events as short strings: task:<state>,
// status:<state>[:<text or data kind>], artifact:<text>.
func describe(ev a2a.Event) string {
	switch e := ev.(type) {
	case *a2a.Task:
		return "task:" + stateName(e.Status.State)
	case *a2a.TaskStatusUpdateEvent:
		s := "status:" + stateName(e.Status.State)
		if m := e.Status.Message; m != nil && len(m.Parts) > 0 {
			if d, ok := m.Parts[0].Data().(map[string]any); ok {
				for k := range d {
					s += ":" + k
				}
			} else {
				s += ":" + m.Parts[0].Text()
			}
		}
		return s
	case *a2a.TaskArtifactUpdateEvent:
		var b strings.Builder
		for _, p := range e.Artifact.Parts {
			b.WriteString(p.Text())
		}
		return "artifact:" + b.String()
	case *a2a.Message:
		return "message"
	}
	return fmt.Sprintf("%T", ev)
}

func stateName(s a2a.TaskState) string {
	return strings.ToLower(strings.TrimPrefix(string(s), "TASK_STATE_"))
}

// collect reads a stream to its end: its events described, the task id,
// and its error.
func collect(events func(func(a2a.Event, error) bool)) ([]string, a2a.TaskID, error) {
	var out []string
	var id a2a.TaskID
	for ev, err := range events {
		if err != nil {
			return out, id, err
		}
		if ti, ok := ev.(a2a.TaskInfoProvider); ok && id == "" {
			id = ti.TaskInfo().TaskID
		}
		out = append(out, describe(ev))
	}
	return out, id, nil
}

// a2aSuite is what TestA2A and TestA2AAcrossReplicas check, with clients
// at one replica (v1, and v0 for the 0.3 names) and a subscriber at
// another, for an agent held wherever.
func a2aSuite(t *testing.T, ctx context.Context, agent *a2aAgent, client, v0, subscriber *a2aclient.Client) {
	// SendMessage waits for the end.
	res, err := client.SendMessage(ctx, textMessage("hello"))
	if err != nil {
		t.Fatal(err)
	}
	task, ok := res.(*a2a.Task)
	if !ok || task.Status.State != a2a.TaskStateCompleted || artifactText(task) != "echo: hello" {
		t.Fatalf("SendMessage: %#v", res)
	}
	if len(task.History) != 1 || task.History[0].Parts[0].Text() != "hello" || task.ContextID == "" {
		t.Fatalf("SendMessage's task history: %+v", task.History)
	}

	// GetTask, on another replica, reads it back from the store.
	got, err := subscriber.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID})
	if err != nil || got.Status.State != a2a.TaskStateCompleted || artifactText(got) != "echo: hello" ||
		len(got.History) != 1 || got.History[0].Parts[0].Text() != "hello" || got.History[0].ID != task.History[0].ID ||
		got.ContextID != task.ContextID || !got.Status.Timestamp.Equal(*task.Status.Timestamp) && got.Status.Timestamp.After(*task.Status.Timestamp) {
		t.Fatalf("GetTask: %+v, %v", got, err)
	}

	// SendStreamingMessage, in the same context: every event mapped.
	req := textMessage("again")
	req.Message.ContextID = task.ContextID
	events, id, err := collect(client.SendStreamingMessage(ctx, req))
	want := "task:submitted|status:working|status:working:hmm|status:working:tool_use|status:working:tool_result|artifact:echo: |artifact:again|status:completed"
	if err != nil || strings.Join(events, "|") != want {
		t.Fatalf("stream: %v, %v\n got %s\nwant %s", events, err, strings.Join(events, "|"), want)
	}
	if got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: id}); err != nil || got.ContextID != task.ContextID || artifactText(got) != "echo: again" {
		t.Fatalf("the streamed task: %+v, %v", got, err)
	}

	// The same messageId is the same task, answered again without the agent.
	first := textMessage("once")
	res1, err1 := client.SendMessage(ctx, first)
	res2, err2 := client.SendMessage(ctx, first)
	task1, ok1 := res1.(*a2a.Task)
	task2, ok2 := res2.(*a2a.Task)
	if err1 != nil || err2 != nil || !ok1 || !ok2 || task1.ID != task2.ID || artifactText(task2) != "echo: once" {
		t.Fatalf("a repeated messageId: %v %v / %v %v", res1, err1, res2, err2)
	}

	// An agent's error fails the task.
	res, err = client.SendMessage(ctx, textMessage("fail"))
	if task, ok := res.(*a2a.Task); err != nil || !ok || task.Status.State != a2a.TaskStateFailed || task.Status.Message.Parts[0].Text() != "boom" {
		t.Fatalf("a failing agent: %+v, %v", res, err)
	}

	// A held task: followed live from another replica, then released.
	held := make(chan []string, 1)
	go func() {
		events, _, _ := collect(client.SendStreamingMessage(ctx, textMessage("hold")))
		held <- events
	}()
	heldID := await(t, agent.holding, "the held message at the agent")
	// A client learns a task's id from its first event, sent once the task
	// is stored; the agent may have the message before that.
	testenv.Eventually(t, time.Minute, "the held task stored", func() bool {
		_, err := subscriber.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(heldID)})
		return err == nil
	})
	subscribed, attached := make(chan []string, 1), make(chan struct{})
	go func() {
		var events []string
		for ev, err := range subscriber.SubscribeToTask(ctx, &a2a.SubscribeToTaskRequest{ID: a2a.TaskID(heldID)}) {
			if err != nil {
				events = append(events, "error:"+err.Error())
				break
			}
			if events = append(events, describe(ev)); len(events) == 1 {
				close(attached)
			}
		}
		subscribed <- events
	}()
	// Once the subscriber has the task, it misses nothing that follows:
	// it goes on from the last stored entry it read.
	select {
	case <-attached:
	case events := <-subscribed:
		t.Fatalf("the subscription ended at once: %v", events)
	case <-ctx.Done():
		t.Fatal("no subscription")
	}
	select {
	case agent.release <- struct{}{}:
	case <-ctx.Done():
		t.Fatal("the agent never took the release")
	}
	if got := await(t, held, "the held stream's end"); got[len(got)-1] != "status:completed" {
		t.Fatalf("held stream: %v", got)
	}
	sub := await(t, subscribed, "the subscription's end")
	if !strings.HasPrefix(sub[0], "task:") || sub[len(sub)-1] != "status:completed" || !strings.Contains(strings.Join(sub, "|"), "artifact: released") {
		t.Fatalf("subscription: %v", sub)
	}

	// A held task canceled from another replica: canceled for the sender
	// and for the canceller.
	go func() {
		events, _, _ := collect(client.SendStreamingMessage(ctx, textMessage("hold")))
		held <- events
	}()
	heldID = await(t, agent.holding, "the second held message at the agent")
	// A client learns a task's id from its first event, sent once the task
	// is stored; the agent may have the message before that.
	testenv.Eventually(t, time.Minute, "the held task stored", func() bool {
		_, err := subscriber.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(heldID)})
		return err == nil
	})
	canceled, err := subscriber.CancelTask(ctx, &a2a.CancelTaskRequest{ID: a2a.TaskID(heldID)})
	if err != nil || canceled.Status.State != a2a.TaskStateCanceled {
		t.Fatalf("CancelTask: %+v, %v", canceled, err)
	}
	if got := await(t, held, "the canceled stream's end"); got[len(got)-1] != "status:canceled:stopped" {
		t.Fatalf("canceled stream: %v", got)
	}
	if _, err := subscriber.CancelTask(ctx, &a2a.CancelTaskRequest{ID: a2a.TaskID(heldID)}); err == nil || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("canceling an ended task: %v", err)
	}
	if got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(heldID)}); err != nil || got.Status.State != a2a.TaskStateCanceled {
		t.Fatalf("GetTask of the canceled task: %+v, %v", got, err)
	}

	// The gateway asked the agent to cancel only what it was holding.
	if stray := agent.strayCancels(); len(stray) > 0 {
		t.Errorf("the agent was told to cancel requests it had ended: %v", stray)
	}

	// The 0.3 method names.
	res, err = v0.SendMessage(ctx, textMessage("old"))
	oldTask, ok := res.(*a2a.Task)
	if err != nil || !ok || oldTask.Status.State != a2a.TaskStateCompleted || artifactText(oldTask) != "echo: old" {
		t.Fatalf("message/send: %+v, %v", res, err)
	}
	if got, err := v0.GetTask(ctx, &a2a.GetTaskRequest{ID: oldTask.ID}); err != nil || artifactText(got) != "echo: old" {
		t.Fatalf("tasks/get: %+v, %v", got, err)
	}
	events, _, err = collect(v0.SendStreamingMessage(ctx, textMessage("old stream")))
	if err != nil || events[len(events)-1] != "status:completed" || !strings.Contains(strings.Join(events, "|"), "artifact:old stream") {
		t.Fatalf("message/stream: %v, %v", events, err)
	}
}

func TestA2A(t *testing.T) {
	eachHistoryStore(t, func(t *testing.T, st store.Store) {
		conn, base := startTuned(t, "gw-a2a", st, withHistory(nil))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		agent := startA2AAgent(t, ctx, conn, "a2a-1", false)

		// Cards: listed, one per agent, the token required.
		if code, body := getBody(t, base+"/a2a/agents", ""); code != http.StatusUnauthorized || !strings.Contains(body, `"status":"UNAUTHENTICATED"`) {
			t.Fatalf("cards without a token: %d %s", code, body)
		}
		code, body := getBody(t, base+"/a2a/agents", token)
		var list struct {
			Agents []struct {
				Name                string `json:"name"`
				URL                 string `json:"url"`
				SupportedInterfaces []struct {
					URL             string `json:"url"`
					ProtocolVersion string `json:"protocolVersion"`
				} `json:"supportedInterfaces"`
				Capabilities struct {
					Streaming bool `json:"streaming"`
				} `json:"capabilities"`
				Skills []struct {
					ID string `json:"id"`
				} `json:"skills"`
				SecuritySchemes map[string]any `json:"securitySchemes"`
			} `json:"agents"`
		}
		if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list.Agents) != 1 {
			t.Fatalf("cards: %d %s", code, body)
		}
		c := list.Agents[0]
		if c.Name != "A2A test agent" || !c.Capabilities.Streaming || len(c.Skills) != 2 || c.Skills[0].ID != "chat" ||
			c.URL != base+"/a2a/a2a-1" || len(c.SupportedInterfaces) != 2 || c.SupportedInterfaces[0].ProtocolVersion != "1.0" ||
			c.SupportedInterfaces[1].ProtocolVersion != "0.3" || c.SecuritySchemes["bearer"] == nil {
			t.Fatalf("card: %s", body)
		}
		code, body = getBody(t, base+"/a2a/ghost/.well-known/agent-card.json", token)
		if code != http.StatusNotFound || !strings.Contains(body, `"status":"NOT_FOUND"`) || !strings.Contains(body, `"domain":"a2a-protocol.org"`) {
			t.Fatalf("card of an agent not connected: %d %s", code, body)
		}

		client := a2aClient(t, ctx, base, "a2a-1", token, false)
		a2aSuite(t, ctx, agent, client, a2aClient(t, ctx, base, "a2a-1", token, true), a2aClient(t, ctx, base, "a2a-1", token, false))

		// Another client's task is not found.
		res, err := client.SendMessage(ctx, textMessage("mine"))
		if err != nil {
			t.Fatal(err)
		}
		mine, ok := res.(*a2a.Task)
		if !ok {
			t.Fatalf("SendMessage answered %T %+v, want a task", res, res)
		}
		other := a2aClient(t, ctx, base, "a2a-1", otherToken, false)
		if _, err := other.GetTask(ctx, &a2a.GetTaskRequest{ID: mine.ID}); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Fatalf("another client's task: %v", err)
		}
		// A task is reached at its own agent's endpoint only.
		code, body = rpc(t, base+"/a2a/someone-else", token, "application/json",
			`{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"`+string(mine.ID)+`"}}`)
		if code != http.StatusOK || rpcCode(t, body) != -32001 {
			t.Fatalf("a task asked of another agent: %d %s", code, body)
		}
		// Nor may it write in the other's context.
		intrude := textMessage("me too")
		intrude.Message.ContextID = mine.ContextID
		if _, err := other.SendMessage(ctx, intrude); err == nil || !strings.Contains(err.Error(), "belongs to another client") {
			t.Fatalf("a message in another client's context: %v", err)
		}
	})
}

// getBody GETs url, with tok unless it is empty.
func getBody(t *testing.T, url, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, b := testenv.Do(t, req)
	return resp.StatusCode, string(b)
}

// rpc posts one JSON-RPC body to url and returns the HTTP status and the
// response.
func rpc(t *testing.T, url, tok, contentType, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, b := testenv.Do(t, req)
	return resp.StatusCode, string(b)
}

// rpcCode is the JSON-RPC error code of a response, 0 when it has none.
func rpcCode(t *testing.T, body string) int {
	t.Helper()
	var r struct {
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("not JSON-RPC: %s", body)
	}
	if r.Error == nil {
		return 0
	}
	return r.Error.Code
}

func TestA2ABadInput(t *testing.T) {
	t.Parallel()
	conn, base := startTuned(t, "gw-a2a-bad", openStore(t), withHistory(nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	startA2AAgent(t, ctx, conn, "bad-1", false)
	url := base + "/a2a/bad-1"
	msg := func(parts string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m-` + fmt.Sprint(time.Now().UnixNano()) + `","role":"ROLE_USER","parts":` + parts + `}}}`
	}
	big := strings.Repeat("x", 300<<10)
	cases := []struct {
		name, tok, contentType, body string
		status, code                 int
		says                         string
	}{
		{"no token", "", "application/json", msg(`[{"text":"hi"}]`), 401, -31401, "authorization"},
		{"wrong token", "wrong-token-0123456789", "application/json", msg(`[{"text":"hi"}]`), 401, -31401, "invalid bearer token"},
		{"not JSON", token, "application/json", `{"jsonrpc":`, 200, -32700, ""},
		{"no method", token, "application/json", `{"jsonrpc":"2.0","id":1}`, 200, -32600, ""},
		{"unknown method", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"tasks/explode","params":{}}`, 200, -32601, ""},
		{"unknown 1.0 method", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"Explode","params":{}}`, 200, -32601, ""},
		{"part without content", token, "application/json", msg(`[{"filename":"x"}]`), 200, -32700, "unknown part content type"},
		{"part with two contents", token, "application/json", msg(`[{"text":"a","raw":"YQ=="}]`), 200, -32700, "exactly one"},
		{"parts not a list", token, "application/json", msg(`{"text":"a"}`), 200, -32602, ""},
		{"no parts", token, "application/json", msg(`[]`), 200, -32602, "parts is empty"},
		{"url part", token, "application/json", msg(`[{"url":"http://169.254.169.254/"}]`), 200, -32005, "url parts are not supported"},
		{"oversized text", token, "application/json", msg(`[{"text":"` + big + `"}]`), 200, -32602, "at most 262144 are allowed"},
		{"too many files", token, "application/json", msg(`[` + strings.Repeat(`{"raw":"YQ=="},`, 20) + `{"text":"x"}]`), 200, -32602, "attachments"},
		{"oversized body", token, "application/json", msg(`[{"raw":"` + strings.Repeat("A", 6<<20) + `"}]`), 413, 0, "request body exceeds"},
		{"no messageId", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER","parts":[{"text":"x"}]}}}`, 200, -32602, "messageId"},
		{"bad contextId", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","contextId":"a b","role":"ROLE_USER","parts":[{"text":"x"}]}}}`, 200, -32602, "thread_id"},
		{"continuing a task", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","taskId":"t","role":"ROLE_USER","parts":[{"text":"x"}]}}}`, 200, -32004, "takes no input from its client"},
		{"unknown task", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"gw-a2a-bad.0011"}}`, 200, -32001, "not found"},
		{"unknown task (0.3)", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"gw-a2a-bad.0011"}}`, 200, -32001, "not found"},
		{"bad task id", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"CancelTask","params":{"id":"a b"}}`, 200, -32602, "request_id"},
		{"subscribe to an unknown task", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id":"gw-a2a-bad.0011"}}`, 200, -32001, "not found"},
		{"push config", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"GetTaskPushNotificationConfig","params":{"taskId":"x","id":"y"}}`, 200, -32003, ""},
		{"not JSON content type", token, "text/plain", msg(`[{"text":"hi"}]`), 415, 0, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := rpc(t, url, c.tok, c.contentType, c.body)
			if status != c.status {
				t.Fatalf("HTTP %d, want %d: %.300s", status, c.status, body)
			}
			if c.code != 0 {
				if _, data, ok := strings.Cut(body, "data: "); ok {
					body = data // a stream's one event
				}
				if got := rpcCode(t, body); got != c.code {
					t.Fatalf("code %d, want %d: %.300s", got, c.code, body)
				}
			}
			if !strings.Contains(body, c.says) {
				t.Fatalf("the answer does not say %q: %.300s", c.says, body)
			}
		})
	}
	// A message to an agent that is not connected.
	status, body := rpc(t, base+"/a2a/ghost", token, "application/json", msg(`[{"text":"hi"}]`))
	if status != 200 || rpcCode(t, body) != -32000 || !strings.Contains(body, `agent \"ghost\" is not connected`) {
		t.Fatalf("a message to an agent not connected: %d %s", status, body)
	}
}

// TestA2AAcrossReplicas runs the A2A suite on three gateway replica
// processes over dynalite, the agent connected through nginx: the clients
// call a replica that does not hold the agent, and GetTask,
// SubscribeToTask and CancelTask go to the third one.
func TestA2AAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three gateway processes, nginx and dynalite")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("a2a%d-", time.Now().UnixNano())
	replicas := map[string]*replicaProc{}
	var upstreams []string
	for i := range 3 {
		r := startReplicaProcess(t, fmt.Sprintf("gw-%d", i), prefix)
		replicas[r.id] = r
		upstreams = append(upstreams, r.grpcAddr)
	}
	lb, err := testenv.NginxGRPC(ctx, t.TempDir(), upstreams, "2s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.Stop)
	agent := startA2AAgent(t, ctx, dialLB(t, lb.Addr), "agent-7", true)
	var others []*replicaProc
	for id, r := range replicas {
		if id != agent.serverID {
			others = append(others, r)
		}
	}
	if len(others) != 2 {
		t.Fatalf("the agent is on %q, not one of the replicas", agent.serverID)
	}
	clientBase, subscriberBase := "http://"+others[0].httpAddr, "http://"+others[1].httpAddr
	a2aSuite(t, ctx, agent,
		a2aClient(t, ctx, clientBase, "agent-7", token, false),
		a2aClient(t, ctx, clientBase, "agent-7", token, true),
		a2aClient(t, ctx, subscriberBase, "agent-7", token, false))
}
