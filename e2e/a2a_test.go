package e2e

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// stepA2A: an Agent2Agent client (a2a-go's own a2aclient, over JSON-RPC)
// reads the example coven agent's card at the gateway, sends it a message
// and gets the completed task with the agent's answer, then reads the task
// back with GetTask. One trace: the client's requests and the gateway's
// spans. Then, where the runner's agents are on the gateway, the same
// client asks a runner agent whose permission a person decides
// (a2aRunnerAgent).
func stepA2A(r *stepRun) {
	sh := r.sh
	r.startCovenAgent()

	ctx, root := r.root("step 9: an A2A client asks the coven agent")
	httpClient := &http.Client{Transport: testenv.Bearer{Token: sh.gatewayToken, Next: r.http.Transport}}
	card, err := agentcard.NewResolver(httpClient).Resolve(ctx, sh.gatewayHTTP+"/a2a/"+sh.covenAgentID)
	if err != nil {
		r.t.Fatalf("the agent's card: %v", err)
	}
	if !card.Capabilities.Streaming {
		r.t.Errorf("the card does not declare streaming: %+v", card.Capabilities)
	}
	client, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(httpClient))
	if err != nil {
		r.t.Fatalf("a2aclient from the card: %v", err)
	}
	defer client.Destroy()

	const question = "hello over A2A"
	res, err := client.SendMessage(ctx, &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(question))})
	if err != nil {
		r.t.Fatalf("SendMessage: %v", err)
	}
	task, ok := res.(*a2a.Task)
	if !ok {
		r.t.Fatalf("SendMessage answered %T, not a task: %+v", res, res)
	}
	if task.Status.State != a2a.TaskStateCompleted || !strings.HasPrefix(answerText(task), "You said: "+question) || task.ContextID == "" {
		r.t.Fatalf("SendMessage's task: state %s, answer %q, context %q", task.Status.State, answerText(task), task.ContextID)
	}
	got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID})
	root.End()
	if err != nil {
		r.t.Fatalf("GetTask %s: %v", task.ID, err)
	}
	if got.Status.State != a2a.TaskStateCompleted || answerText(got) != answerText(task) || got.ContextID != task.ContextID ||
		len(got.History) == 0 || got.History[0].Parts[0].Text() != question {
		r.t.Fatalf("GetTask: state %s, answer %q, context %q, history %+v; SendMessage's task answered %q in %q",
			got.Status.State, answerText(got), got.ContextID, got.History, answerText(task), task.ContextID)
	}
	r.expectTrace(root, in(gateway))
	a2aRunnerAgent(r, httpClient)
}

// answerText is the text of a task's artifacts (the agent's answer).
func answerText(task *a2a.Task) string {
	var b strings.Builder
	for _, a := range task.Artifacts {
		for _, p := range a.Parts {
			b.WriteString(p.Text())
		}
	}
	return b.String()
}

// a2aRunnerAgent: the A2A client asks a runner agent on the gateway: the
// example ACP agent of the governed type (the librarian policy; the
// Librarian escalates its permission request to a person), launched with
// "gateway": true. A streamed message makes the task input-required while
// a person decides, saying which tool call waits and where it is decided;
// meanwhile GetTask shows it input-required, a subscriber follows it, and
// a message on the task is refused, naming where to decide. The person
// approves through the Librarian's review API, and the task goes back to
// working and completes, on the stream and for the subscriber. A blocking
// SendMessage returns at the next wait, input-required, and CancelTask
// cancels it there. An agent in a Job's pod gets the same checks: its
// agent-host holds its registration at the gateway, and the runner tells
// the wait to it over their link.
func a2aRunnerAgent(r *stepRun, httpClient *http.Client) {
	sh := r.sh
	ctx := r.ctx
	u := unique()
	// A workspace of its own, where this host has the agents' workspaces;
	// a Job's pod has its own.
	workspace := filepath.Join(sh.workspace, "e2e-a2a-"+u)
	if !sh.agentsRemote {
		if err := os.MkdirAll(workspace, 0o755); err != nil {
			r.t.Fatal(err)
		}
	}
	var inst struct {
		ID string `json:"id"`
	}
	if status, body := r.do(ctx, http.MethodPost, sh.runnerHTTP+"/api/v1/agents/launch", sh.runnerToken, map[string]any{
		"task_id": "e2e-a2a-" + u, "agent_type": governedAgentType, "workspace_path": workspace, "metadata": map[string]any{"gateway": true},
	}, &inst); status/100 != 2 || inst.ID == "" {
		r.t.Fatalf("launch: %d %s", status, body)
	}
	defer r.explainInstance(inst.ID)
	var card *a2a.AgentCard
	r.waitFor("the runner's agent's A2A card at the gateway", func() string {
		var err error
		if card, err = agentcard.NewResolver(httpClient).Resolve(ctx, sh.gatewayHTTP+"/a2a/"+inst.ID); err != nil {
			return err.Error()
		}
		return ""
	})
	client, err := a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(httpClient))
	if err != nil {
		r.t.Fatalf("a2aclient from the runner agent's card: %v", err)
	}
	defer client.Destroy()

	// Streamed, up to the wait.
	const question = "write the notes over A2A"
	next, stop := iter.Pull2(client.SendStreamingMessage(ctx, &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(question))}))
	defer stop()
	var taskID a2a.TaskID
	var states []a2a.TaskState
	var waiting *a2a.TaskStatusUpdateEvent
	for waiting == nil {
		ev, err, ok := next()
		if !ok || err != nil {
			r.t.Fatalf("the stream ended before the task waited for a person: %v (states %v)", err, states)
		}
		switch e := ev.(type) {
		case *a2a.Task:
			taskID = e.ID
		case *a2a.TaskStatusUpdateEvent:
			states = append(states, e.Status.State)
			if e.Status.State.Terminal() {
				r.t.Fatalf("the task ended %s before it waited for a person: %+v", e.Status.State, e.Status.Message)
			}
			if e.Status.State == a2a.TaskStateInputRequired {
				waiting = e
			}
		}
	}
	if m := waiting.Status.Message; m == nil || len(m.Parts) != 2 || !strings.Contains(m.Parts[0].Text(), `tool call "call_1"`) ||
		!strings.Contains(m.Parts[0].Text(), "the Librarian's review") || !strings.Contains(fmt.Sprint(m.Parts[1].Data()), "TOOL_STATE_AWAITING_APPROVAL") {
		r.t.Fatalf("the input-required status: %+v", m)
	} else if strings.Contains(m.Parts[0].Text(), "/review/") {
		r.t.Errorf("the input-required status names the review's URL: %s", m.Parts[0].Text())
	}

	// During the wait: GetTask (the history is written a little late), a
	// subscriber, and a message on the task.
	r.waitFor("GetTask to show the task input-required", func() string {
		got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: taskID})
		if err != nil {
			return err.Error()
		}
		if got.Status.State != a2a.TaskStateInputRequired {
			return "state " + string(got.Status.State)
		}
		return ""
	})
	subscribed := make(chan []a2a.TaskState, 1)
	subCtx, cancelSub := context.WithCancel(ctx)
	defer cancelSub()
	go func() {
		var seen []a2a.TaskState
		for ev, err := range client.SubscribeToTask(subCtx, &a2a.SubscribeToTaskRequest{ID: taskID}) {
			if err != nil {
				seen = append(seen, a2a.TaskState("error: "+err.Error()))
				break
			}
			switch e := ev.(type) {
			case *a2a.Task:
				seen = append(seen, e.Status.State)
			case *a2a.TaskStatusUpdateEvent:
				seen = append(seen, e.Status.State)
			}
		}
		subscribed <- seen
	}()
	_, err = client.SendMessage(ctx, &a2a.SendMessageRequest{Message: a2a.NewMessageForTask(a2a.MessageRoleUser, a2a.TaskInfo{TaskID: taskID}, a2a.NewTextPart("approve it"))})
	if !errors.Is(err, a2a.ErrUnsupportedOperation) || !strings.Contains(err.Error(), "the Librarian's review") {
		r.t.Errorf("a message on the waiting task: %v; want unsupported, naming where to decide", err)
	}

	// A person approves; the task goes on.
	r.decideEscalation(inst.ID, "approve")
	for {
		ev, err, ok := next()
		if !ok {
			break
		}
		if err != nil {
			r.t.Fatalf("the stream after the decision: %v (states %v)", err, states)
		}
		if e, isStatus := ev.(*a2a.TaskStatusUpdateEvent); isStatus {
			states = append(states, e.Status.State)
		}
	}
	if !afterWait(states, a2a.TaskStateCompleted) {
		r.t.Errorf("the stream's states %v: want input-required, then working, then completed", states)
	}
	var seen []a2a.TaskState
	select {
	case seen = <-subscribed:
	case <-ctx.Done():
		r.t.Fatal("waiting for the subscriber to see the task end")
	}
	if len(seen) == 0 || seen[0] != a2a.TaskStateInputRequired || !afterWait(seen, a2a.TaskStateCompleted) {
		r.t.Errorf("the subscriber's states %v: want the task input-required, then working, then completed", seen)
	}
	got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: taskID})
	if err != nil || got.Status.State != a2a.TaskStateCompleted || !strings.Contains(answerText(got), "Working on: "+question) {
		r.t.Errorf("GetTask after the decision: %v %+v", err, got)
	}

	// Blocking: SendMessage returns at the wait; CancelTask cancels it.
	res, err := client.SendMessage(ctx, &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("and once more"))})
	if err != nil {
		r.t.Fatalf("SendMessage: %v", err)
	}
	task, ok := res.(*a2a.Task)
	if !ok || task.Status.State != a2a.TaskStateInputRequired {
		r.t.Fatalf("SendMessage answered %+v; want the task input-required", res)
	}
	canceled, err := client.CancelTask(ctx, &a2a.CancelTaskRequest{ID: task.ID})
	if err != nil || canceled.Status.State != a2a.TaskStateCanceled {
		r.t.Fatalf("CancelTask during the wait: %v %+v", err, canceled)
	}
	r.waitFor("GetTask to show the task canceled", func() string {
		got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID})
		if err != nil {
			return err.Error()
		}
		if got.Status.State != a2a.TaskStateCanceled {
			return "state " + string(got.Status.State)
		}
		return ""
	})
}

// afterWait reports whether states has input-required, then working, and
// ends in end.
func afterWait(states []a2a.TaskState, end a2a.TaskState) bool {
	waited := false
	for i, s := range states {
		if s == a2a.TaskStateInputRequired {
			waited = true
		}
		if waited && s == a2a.TaskStateWorking {
			return states[len(states)-1] == end && i < len(states)-1
		}
	}
	return false
}

// decideEscalation decides, as a reviewer, through the Librarian's API,
// the request instance id waits for.
func (r *stepRun) decideEscalation(id, decision string) {
	var st struct {
		Status    string `json:"status"`
		ReviewURL string `json:"review_url"`
	}
	r.waitFor("the instance to await approval with the review's URL", func() string {
		r.do(r.ctx, http.MethodGet, r.sh.runnerHTTP+"/api/v1/agents/"+id+"/status", r.sh.runnerToken, nil, &st)
		if st.Status != "awaiting_approval" || st.ReviewURL == "" {
			return "status " + st.Status
		}
		return ""
	})
	if status, body := r.do(r.ctx, http.MethodPost, r.sh.librarianURL+"/reviews/"+path.Base(st.ReviewURL)+"/decision", r.sh.reviewerToken,
		map[string]string{"decision": decision, "comment": "Decided in the end-to-end scenario's A2A step."}, nil); status != http.StatusOK {
		r.t.Fatalf("deciding the escalated request %s: %d %s", path.Base(st.ReviewURL), status, body)
	}
}
