package e2e

import (
	"net/http"
	"strings"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
)

// stepA2A: an Agent2Agent client (a2a-go's own a2aclient, over JSON-RPC)
// reads the example coven agent's card at the gateway, sends it a message
// and gets the completed task with the agent's answer, then reads the task
// back with GetTask. One trace: the client's requests and the gateway's
// spans.
func stepA2A(r *stepRun) {
	sh := r.sh
	if !sh.a2a {
		r.t.Skip("not yet run on this shape")
	}
	r.startCovenAgent()

	ctx, root := r.root("step 9: an A2A client asks the coven agent")
	httpClient := &http.Client{Transport: bearer{sh.gatewayToken, r.http.Transport}}
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
