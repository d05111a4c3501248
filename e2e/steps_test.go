package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// stepCovenAgent: the example coven agent registers at the gateway; a
// client sends it a message over the REST API and reads the streamed
// answer as Server-Sent Events. One trace: the client's request and the
// gateway's spans (the example agent adds none: it does not read
// SendMessage's trace_context).
func stepCovenAgent(r *stepRun) {
	sh := r.sh
	agentURL := r.startCovenAgent()

	ctx, root := r.root("step 1: a client asks the coven agent")
	const question = "hello from the end-to-end scenario"
	req, err := request(ctx, http.MethodPost, agentURL+"/messages", sh.gatewayToken, map[string]string{"content": question, "sender": "e2e"})
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := r.http.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	events, err := readSSE(resp.Body)
	resp.Body.Close()
	root.End()
	if err != nil || resp.StatusCode != http.StatusOK {
		r.t.Fatalf("POST %s/messages: %d, %v: %+v", agentURL, resp.StatusCode, err, events)
	}
	var text strings.Builder
	var done *string
	for _, e := range events {
		if e.name != "message" {
			continue
		}
		var m struct {
			RequestID string `json:"request_id"`
			Event     struct {
				Text *string `json:"text"`
				Done *struct {
					FullResponse string `json:"full_response"`
				} `json:"done"`
			} `json:"event"`
		}
		if err := json.Unmarshal([]byte(e.data), &m); err != nil {
			r.t.Fatalf("event %q: %v", e.data, err)
		}
		if m.Event.Text != nil {
			text.WriteString(*m.Event.Text)
		}
		if m.Event.Done != nil {
			done = &m.Event.Done.FullResponse
		}
	}
	if len(events) == 0 || events[len(events)-1].name != "end" {
		r.t.Fatalf("the stream did not end with an end event: %+v", events)
	}
	if !strings.HasPrefix(text.String(), "You said: "+question) || done == nil || *done != text.String() {
		r.t.Fatalf("streamed text %q, done %v; events %+v", text.String(), done, events)
	}
	// REST calls the client API in process: the gateway's span is its
	// HTTP server span, with no gRPC hop under it.
	r.expectTrace(root, spanOf(gateway, "POST /v1/agents/{agent_id}/messages"))
}

// startCovenAgent starts the example coven agent (examples/coven-agent),
// which dials the gateway's agent port as covenAgentID, until the step
// ends; it returns the agent's REST URL once the gateway lists it.
func (r *stepRun) startCovenAgent() string {
	sh := r.sh
	bin := binaries(r.t, "./examples/coven-agent")["./examples/coven-agent"]
	agentLog := &testenv.LockedBuffer{}
	agent := exec.Command(bin, "--addr", sh.gatewayGRPC, "--agent-id", sh.covenAgentID, "--name", "e2e coven agent", "--step-delay", "0s")
	agent.Env = append(agent.Environ(), "COVEN_AGENT_TOKEN="+sh.covenAgentToken)
	agent.Stdout, agent.Stderr = agentLog, agentLog
	agent.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := agent.Start(); err != nil {
		r.t.Fatal(err)
	}
	// Its log is in this step's report only; the report runs before the
	// cleanups.
	r.t.Cleanup(r.sh.addLog("coven-agent", agentLog.String))
	r.t.Cleanup(func() { _ = agent.Process.Signal(syscall.SIGTERM); _ = agent.Wait() })

	agentURL := sh.gatewayHTTP + "/v1/agents/" + sh.covenAgentID
	r.waitFor("the coven agent to register", func() string {
		if status, body := r.do(r.ctx, http.MethodGet, agentURL, sh.gatewayToken, nil, nil); status != http.StatusOK {
			return fmt.Sprintf("GET %s: %d %s", agentURL, status, body)
		}
		return ""
	})
	return agentURL
}

// stepDefaultHandler: a message on a topic nobody subscribes to makes the
// bus's default handler ask the runner for an agent; the runner launches
// the example ACP agent over stdio, which joins the bus with its BUB_*
// variables, takes the message, publishes a reply on agent:{its id} and
// acknowledges it; the publisher gets the ack. One trace: the publisher's
// call, the bus's publish and delivery, the runner's launch (gRPC, its
// queue, the worker starting the agent), and the agent's reply, published
// in the delivery's trace.
func stepDefaultHandler(r *stepRun) {
	sh := r.sh
	u := unique()
	topic := "e2e-chat:" + u
	replies := r.dialBus(r.ctx, "e2e-replies-"+u, false, nil)
	replies.subscribe(r, r.ctx, "agent:*")
	pub := r.dialBus(r.ctx, "e2e-publisher-"+u, false, nil)

	ctx, root := r.root("step 2: a message on an unrouted topic")
	traceID := root.SpanContext().TraceID().String()
	sent := time.Now()
	res := pub.send(r, ctx, topic, map[string]string{"type": "chat_message", "text": "hello, agent"})
	r.t.Logf("the publisher's ack after %s (the launch, the agent's start, its answer)", time.Since(sent).Round(time.Millisecond))
	if !res.Success || len(res.Acks) != 1 {
		r.t.Fatalf("sendMessage on %s: %+v", topic, res)
	}
	ack := res.Acks[0]
	if !regexp.MustCompile(`^agent-[0-9a-f]{16}$`).MatchString(ack.ClientID) || !ack.Processed ||
		ack.Message != fmt.Sprintf("%s processed chat_message message %q", ack.ClientID, "hello, agent") {
		r.t.Fatalf("the ack: %+v", ack)
	}
	agentID := ack.ClientID
	reply := replies.next(r, "the agent's reply on agent:"+agentID, func(d delivery) bool { return d.Topic == "agent:"+agentID })
	if p := reply.payload(); p["from"] != agentID || p["text"] != ack.Message || p["in_reply_to"] == "" {
		r.t.Errorf("the reply: %s", reply.Payload)
	}
	if reply.traceID != traceID {
		r.t.Errorf("the reply came in trace %s, not the publisher's %s", reply.traceID, traceID)
	}

	// The runner holds the launch: the task is the agent's id, its one
	// instance of the ACP type with an ACP session, which only the
	// handshake over stdio (initialize, session/new) gives.
	var task struct {
		AgentType   string   `json:"agent_type"`
		InstanceIDs []string `json:"instance_ids"`
	}
	if status, body := r.do(r.ctx, http.MethodGet, sh.runnerHTTP+"/api/v1/tasks/"+agentID, sh.runnerToken, nil, &task); status != http.StatusOK ||
		len(task.InstanceIDs) != 1 || task.AgentType != busAgentType {
		r.t.Fatalf("the runner's task %s: %d %s", agentID, status, body)
	}
	var session struct {
		SessionID string `json:"session_id"`
	}
	r.waitFor("the agent's ACP session", func() string {
		status, body := r.do(r.ctx, http.MethodGet, sh.runnerHTTP+"/api/v1/agents/"+task.InstanceIDs[0]+"/session", sh.runnerToken, nil, &session)
		if status != http.StatusOK || session.SessionID == "" {
			return fmt.Sprintf("%d %s", status, body)
		}
		return ""
	})
	root.End()
	r.expectTrace(root, spanOf(bus, "bus publish"), spanOf(runner, "conclave.runner.v1.RunnerService/LaunchAgent"),
		spanOf(runner, "start agent"), spanOf(bus, "bus deliver processMessage"), spanOf(bus, "bus deliver sendMessage"))
}

// stepTaskProgress: a bus subscriber of task:{task_id} sees a task the
// runner runs make progress: the example ACP agent's updates (its plan,
// its text, its tool call) and the task's status changes, to completed.
// One trace: the launch through the runner's API, queue and worker, and
// each event through the events queue to the bus and the subscriber.
func stepTaskProgress(r *stepRun) {
	sh := r.sh
	u := unique()
	taskID := "e2e-task-" + u
	sub := r.dialBus(r.ctx, "e2e-task-watcher-"+u, false, nil)
	sub.subscribe(r, r.ctx, "task:"+taskID)

	ctx, root := r.root("step 3: a runner task's progress on the bus")
	traceID := root.SpanContext().TraceID().String()
	var inst struct {
		ID string `json:"id"`
	}
	if status, body := r.do(ctx, http.MethodPost, sh.runnerHTTP+"/api/v1/agents/launch", sh.runnerToken, map[string]any{
		"task_id": taskID, "agent_type": acpAgentType, "workspace_path": sh.workspace,
		"env": map[string]string{"TASK_DESCRIPTION": "take notes on issue 15"},
	}, &inst); status/100 != 2 || inst.ID == "" {
		r.t.Fatalf("launch: %d %s", status, body)
	}
	defer r.explainInstance(inst.ID)
	// The bus publishes the events queue's messages from more than one
	// worker, and delivers at least once: the step waits until it has
	// seen, once each, the running and completed statuses and the agent's
	// plan (its progress), in whatever order they come.
	var statuses, updates []string
	seen := map[string]bool{}
	for !slices.Contains(statuses, "running") || !slices.Contains(statuses, "completed") || !slices.Contains(updates, "plan") {
		d := sub.next(r, fmt.Sprintf("the task's events on task:%s (so far statuses %v, updates %v)", taskID, statuses, updates),
			func(d delivery) bool { return d.Topic == "task:"+taskID })
		var ev struct {
			Type       string            `json:"type"`
			EventID    string            `json:"event_id"`
			SubjectIDs map[string]string `json:"subject_ids"`
			// Data is the event's google.protobuf.Struct, as protojson
			// writes an Any holding one.
			Data struct {
				Value struct {
					Kind   string `json:"kind"`
					Status string `json:"status"`
				} `json:"value"`
			} `json:"data"`
		}
		if err := json.Unmarshal(d.Payload, &ev); err != nil {
			r.t.Fatalf("event %s: %v", d.Payload, err)
		}
		if d.traceID != traceID {
			r.t.Errorf("event %s came in trace %s, not the launch's %s", d.Payload, d.traceID, traceID)
		}
		if ev.SubjectIDs["instance_id"] != inst.ID {
			r.t.Errorf("event of another instance: %s", d.Payload)
		}
		if seen[ev.EventID] {
			continue
		}
		seen[ev.EventID] = true
		switch ev.Type {
		case "runner.task.status_changed":
			statuses = append(statuses, ev.Data.Value.Status)
			if st := ev.Data.Value.Status; st == "failed" || st == "stopped" {
				r.t.Fatalf("the task ended %s (statuses %v, updates %v)", st, statuses, updates)
			}
		case "runner.session.update":
			updates = append(updates, ev.Data.Value.Kind)
		default:
			r.t.Errorf("unexpected event: %s", d.Payload)
		}
	}
	root.End()
	r.t.Logf("task %s: statuses %v, updates %v", taskID, statuses, updates)
	r.expectTrace(root, spanOf(runner, "conclave.runner.v1.RunnerService/LaunchAgent"), spanOf(runner, "start agent"),
		spanOf(bus, "bus-events process"), spanOf(bus, "bus deliver sendMessage"))
}

// stepLibrarian: an agent's APPROVAL request is approved by the rules; a
// second, of high risk, is escalated, and a reviewer approves it on the
// review page in a real browser. Both decisions reach a subscriber of
// system:librarian.*. Two traces, one per request, each holding the
// Librarian's spans and the bus's publishing of its events; the review
// page's decision is in the second, since the browser sends the trace
// context the test gives it.
func stepLibrarian(r *stepRun) {
	sh := r.sh
	u := unique()
	sub := r.dialBus(r.ctx, "e2e-governance-"+u, false, nil)
	sub.subscribe(r, r.ctx, "system:librarian.*")
	ask := func(ctx context.Context, title, risk string) librarianResponse {
		r.t.Helper()
		body := map[string]any{
			"agent_id": "claude-3", "request_type": "APPROVAL", "action": "create", "target_type": "design",
			"target_path": "docs/design/e2e-" + u + "-" + strings.ToLower(strings.ReplaceAll(title, " ", "-")) + ".md",
			"content":     "# " + title + "\n\n## Overview\nWhat it is.\n\n## Design\nHow it works.\n\n## Alternatives\nNone.\n",
			"rationale":   "issue 15's end-to-end scenario", "risk_assessment": risk,
		}
		var resp librarianResponse
		if status, data := r.do(ctx, http.MethodPost, sh.librarianURL+"/agent/request", sh.librarianAgentToken, body, &resp); status != http.StatusOK {
			r.t.Fatalf("POST /agent/request: %d %s", status, data)
		}
		return resp
	}
	event := func(eventType, requestID string) delivery {
		r.t.Helper()
		return sub.next(r, eventType+" of "+requestID, func(d delivery) bool {
			var p struct {
				SubjectIDs map[string]string `json:"subject_ids"`
			}
			_ = json.Unmarshal(d.Payload, &p)
			return d.Topic == "system:"+eventType && p.SubjectIDs["request_id"] == requestID
		})
	}

	ctx, rootA := r.root("step 4a: an approval request the rules approve")
	a := ask(ctx, "E2E Cache Design", "low")
	if a.Status != "approved" {
		r.t.Fatalf("the first request: %+v", a)
	}
	if ev := event("librarian.request.approved", a.RequestID); ev.traceID != rootA.SpanContext().TraceID().String() {
		r.t.Errorf("the approval event came in trace %s, not the request's %s", ev.traceID, rootA.SpanContext().TraceID())
	}
	rootA.End()
	r.expectTrace(rootA, in(librarian), spanOf(bus, "bus-events process"), spanOf(bus, "bus deliver sendMessage"))

	ctx, rootB := r.root("step 4b: an approval request escalated and approved on the review page")
	b := ask(ctx, "E2E Auth Design", "high: changes how every service authenticates")
	if b.Status != "escalated" || b.HumanReviewURL == "" {
		r.t.Fatalf("the second request: %+v", b)
	}
	event("librarian.request.escalated", b.RequestID)
	r.approveOnReviewPage(ctx, b.HumanReviewURL, "Reviewed in the end-to-end scenario.")
	if ev := event("librarian.request.approved", b.RequestID); ev.traceID != rootB.SpanContext().TraceID().String() {
		r.t.Errorf("the reviewer's approval event came in trace %s, not the request's %s", ev.traceID, rootB.SpanContext().TraceID())
	}
	var st struct {
		Status string `json:"status"`
	}
	if status, data := r.do(ctx, http.MethodGet, sh.librarianURL+"/agent/status/"+b.RequestID+"?agent_id=claude-3", sh.librarianAgentToken, nil, &st); status != http.StatusOK || st.Status != "approved" {
		r.t.Errorf("status of %s after the review: %d %s", b.RequestID, status, data)
	}
	rootB.End()
	r.expectTrace(rootB, in(librarian), spanOf(bus, "bus-events process"), spanOf(bus, "bus deliver sendMessage"))
}

// librarianResponse is the part of a LibrarianResponse the scenario reads.
type librarianResponse struct {
	RequestID      string `json:"request_id"`
	Status         string `json:"status"`
	HumanReviewURL string `json:"human_review_url"`
}

// stepBridgeTool: an MCP client calls a tool agent through the bridge over
// streamable HTTP, and the runner runs the same tool agent as a oneshot
// agent type; both give the same labels. One trace: the MCP call's HTTP
// spans in the bridge, and the launch through the runner.
func stepBridgeTool(r *stepRun) {
	sh := r.sh
	const params = `{"repo_name": "conclave-ai/conclave", "issue_number": 15}`
	ctx, root := r.root("step 5: one tool agent, through the bridge and through the runner")

	client := mcp.NewClient(&mcp.Implementation{Name: "conclave-e2e", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: sh.bridgeMCP, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: testenv.Bearer{Token: sh.bridgeToken, Next: r.http.Transport}}}, nil)
	if err != nil {
		r.t.Fatalf("MCP connect to %s: %v", sh.bridgeMCP, err)
	}
	var args map[string]any
	_ = json.Unmarshal([]byte(params), &args)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "label_github_issue", Arguments: args})
	_ = cs.Close()
	if err != nil || res.IsError || len(res.Content) == 0 {
		r.t.Fatalf("tools/call label_github_issue: %v %+v", err, res)
	}
	text, _ := res.Content[0].(*mcp.TextContent)
	if text == nil {
		r.t.Fatalf("tools/call label_github_issue: %+v", res.Content)
	}
	viaBridge := labels(text.Text)

	var inst struct {
		ID string `json:"id"`
	}
	if status, body := r.do(ctx, http.MethodPost, sh.runnerHTTP+"/api/v1/agents/launch", sh.runnerToken, map[string]any{
		"task_id": "e2e-tool-" + unique(), "agent_type": toolAgentType, "workspace_path": sh.workspace,
		"env": map[string]string{"TASK_DESCRIPTION": params},
	}, &inst); status/100 != 2 || inst.ID == "" {
		r.t.Fatalf("launch: %d %s", status, body)
	}
	defer r.explainInstance(inst.ID)
	var st struct {
		Status      string `json:"status"`
		ContainerID string `json:"container_id"`
	}
	r.waitFor("the oneshot run to end", func() string {
		status, body := r.do(ctx, http.MethodGet, sh.runnerHTTP+"/api/v1/agents/"+inst.ID+"/status", sh.runnerToken, nil, &st)
		if status != http.StatusOK || (st.Status != "completed" && st.Status != "failed" && st.Status != "stopped") {
			return fmt.Sprintf("%d %s", status, body)
		}
		return ""
	})
	var logs struct {
		Lines []struct {
			Stream, Text string
		} `json:"lines"`
	}
	r.do(ctx, http.MethodGet, sh.runnerHTTP+"/api/v1/agents/"+inst.ID+"/logs?tail=1000", sh.runnerToken, nil, &logs)
	root.End()
	if st.Status != "completed" || st.ContainerID != "oneshot" {
		r.t.Fatalf("the oneshot instance: %+v; logs %+v", st, logs.Lines)
	}
	var viaRunner []string
	for _, l := range logs.Lines {
		if got := labels(l.Text); got != nil {
			viaRunner = got
		}
	}
	if len(viaBridge) == 0 || !slices.Equal(viaBridge, viaRunner) {
		r.t.Fatalf("labels through the bridge %v (%s), through the runner %v (logs %+v)", viaBridge, text.Text, viaRunner, logs.Lines)
	}
	r.expectTrace(root, in(bridge), spanOf(runner, "conclave.runner.v1.RunnerService/LaunchAgent"), spanOf(bus, "bus-events process"))
}

// explainInstance logs, when the step has failed, what the runner says of
// an instance: its status and its logs.
func (r *stepRun) explainInstance(id string) {
	if !r.t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, path := range []string{"/status", "/logs?tail=200"} {
		req, err := request(ctx, http.MethodGet, r.sh.runnerHTTP+"/api/v1/agents/"+id+path, r.sh.runnerToken, nil)
		if err != nil {
			continue
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			r.t.Logf("the runner's %s of %s: %v", path, id, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r.t.Logf("the runner's %s of %s: %d %s", path, id, resp.StatusCode, body)
	}
}

// labels finds the labels of the label agent's answer in s, the answer's
// JSON or a log line holding it, or returns nil.
func labels(s string) []string {
	i := strings.Index(s, "{")
	if i < 0 {
		return nil
	}
	var v struct {
		Labels []string `json:"labels"`
		Data   struct {
			Labels []string `json:"labels"`
		} `json:"data"`
	}
	if json.NewDecoder(strings.NewReader(s[i:])).Decode(&v) != nil {
		return nil
	}
	if v.Labels != nil {
		return v.Labels
	}
	return v.Data.Labels
}

// stepDeadLetter: an agent that fails its deliveries makes the bus retry a
// message until its attempts are used up, and the message is dead-lettered;
// once the agent recovers, `bub dlq redrive` (the bus's command line)
// delivers it again, and it is processed. One trace: the publish, each
// attempt, the retry queue, and the redriven delivery, which continues the
// message's trace.
func stepDeadLetter(r *stepRun) {
	u := unique()
	topic := "agent:e2e-flaky-" + u
	var failing atomic.Bool
	failing.Store(true)
	agent := r.dialBus(r.ctx, "e2e-flaky-"+u, true, func(delivery) any {
		if failing.Load() {
			return map[string]any{"processed": false, "should_retry": true, "retry_seconds": 1}
		}
		return map[string]any{"processed": true, "should_retry": false, "retry_seconds": 0, "message": "recovered"}
	})
	agent.subscribe(r, r.ctx, topic)
	pub := r.dialBus(r.ctx, "e2e-dlq-publisher-"+u, false, nil)

	ctx, root := r.root("step 6: a failing subscriber, its dead letter, and the redrive")
	traceID := root.SpanContext().TraceID().String()
	res := pub.send(r, ctx, topic, map[string]string{"type": "task_request", "task_id": "e2e-dlq-" + u})
	if len(res.Acks) != 1 || res.Acks[0].Processed || !strings.Contains(res.Acks[0].Message, "attempt 2 of 3 scheduled") {
		r.t.Fatalf("sendMessage: %+v", res)
	}
	var first delivery
	for attempt := 1; attempt <= 3; attempt++ {
		d := agent.next(r, fmt.Sprintf("attempt %d", attempt), func(d delivery) bool { return d.method == "processMessage" && d.Topic == topic })
		if attempt == 1 {
			first = d
		}
		if d.Attempt != attempt || d.MessageID != first.MessageID || d.traceID != traceID {
			r.t.Errorf("attempt %d: %+v (trace %s, want %s)", attempt, d, d.traceID, traceID)
		}
	}

	type deadLetter struct {
		ID, Topic, MessageID string
		Attempts             int
	}
	list := func() ([]deadLetter, string) {
		out, err := r.sh.bub(r.ctx, "dlq", "list").Output()
		if err != nil {
			return nil, fmt.Sprintf("bub dlq list: %v", err)
		}
		var dls []deadLetter
		dec := json.NewDecoder(strings.NewReader(string(out)))
		for dec.More() {
			var dl struct {
				ID        string `json:"id"`
				Topic     string `json:"topic"`
				MessageID string `json:"message_id"`
				Attempts  int    `json:"attempts"`
			}
			if err := dec.Decode(&dl); err != nil {
				return nil, fmt.Sprintf("bub dlq list printed %q: %v", out, err)
			}
			if dl.Topic == topic {
				dls = append(dls, deadLetter{dl.ID, dl.Topic, dl.MessageID, dl.Attempts})
			}
		}
		return dls, ""
	}
	var dead deadLetter
	r.waitFor("the dead letter in `bub dlq list`", func() string {
		dls, problem := list()
		if problem != "" {
			return problem
		}
		if len(dls) != 1 {
			return fmt.Sprintf("dead letters of %s: %+v", topic, dls)
		}
		dead = dls[0]
		return ""
	})
	if dead.MessageID != first.MessageID || dead.Attempts != 3 {
		r.t.Errorf("the dead letter: %+v", dead)
	}

	failing.Store(false)
	out, err := r.sh.bub(r.ctx, "dlq", "redrive", dead.ID).Output()
	if err != nil || !strings.Contains(string(out), dead.ID) {
		r.t.Fatalf("bub dlq redrive %s: %v: %s", dead.ID, err, out)
	}
	d := agent.next(r, "the redriven message", func(d delivery) bool { return d.method == "processMessage" && d.Topic == topic })
	if d.MessageID != first.MessageID || d.traceID != traceID {
		r.t.Errorf("the redriven delivery: %+v (trace %s, want the message's %s)", d, d.traceID, traceID)
	}
	r.waitFor("the dead letter to be gone", func() string {
		if dls, problem := list(); problem != "" || len(dls) != 0 {
			return fmt.Sprintf("%s %+v", problem, dls)
		}
		return ""
	})
	root.End()
	r.expectTrace(root, spanOf(bus, "bus publish"), spanOf(bus, "bus deliver processMessage"), spanOf(bus, "bus-retries process"),
		spanOf(bus, "bus redrive"))
}

// stepGoverned: an agent under the librarian permission policy asks to
// edit a file outside its workspace; the runner asks the Librarian over
// its API, which escalates it; the instance awaits approval with the
// review's URL; a reviewer approves it on the review page in a real
// browser; the decision reaches the waiting turn through the bus, and the
// agent goes on. One trace: the launch, the runner's permission span, the
// Librarian's spans, the bus publishing the decision to the runner, the
// runner's receipt of it (docs/governance.md).
func stepGoverned(r *stepRun) {
	sh := r.sh
	u := unique()
	ctx, root := r.root("step 7: a governed agent asks the Librarian; a person approves")
	var inst struct {
		ID string `json:"id"`
	}
	if status, body := r.do(ctx, http.MethodPost, sh.runnerHTTP+"/api/v1/agents/launch", sh.runnerToken, map[string]any{
		"task_id": "e2e-governed-" + u, "agent_type": governedAgentType, "workspace_path": sh.workspace,
		"env": map[string]string{"TASK_DESCRIPTION": "write the notes of issue 15"},
	}, &inst); status/100 != 2 || inst.ID == "" {
		r.t.Fatalf("launch: %d %s", status, body)
	}
	defer r.explainInstance(inst.ID)
	type statusBody struct {
		Status    string `json:"status"`
		ReviewURL string `json:"review_url"`
	}
	status := func() statusBody {
		var st statusBody
		r.do(ctx, http.MethodGet, sh.runnerHTTP+"/api/v1/agents/"+inst.ID+"/status", sh.runnerToken, nil, &st)
		return st
	}
	var waiting statusBody
	r.waitFor("the instance to await approval", func() string {
		if waiting = status(); waiting.Status != "awaiting_approval" {
			return "status " + waiting.Status
		}
		return ""
	})
	if !strings.HasPrefix(waiting.ReviewURL, sh.librarianURL+"/review/") {
		r.t.Fatalf("review_url %q is not the Librarian's review page", waiting.ReviewURL)
	}
	r.approveOnReviewPage(ctx, waiting.ReviewURL, "Approved in the end-to-end scenario.")
	r.waitFor("the agent to go on and end its turn", func() string {
		switch st := status(); st.Status {
		case "completed":
			return ""
		case "failed", "stopped":
			r.t.Fatalf("the instance ended %s", st.Status)
		default:
			return "status " + st.Status
		}
		return ""
	})
	var logs struct {
		Lines []struct {
			Text string `json:"text"`
		} `json:"lines"`
	}
	r.do(ctx, http.MethodGet, sh.runnerHTTP+"/api/v1/agents/"+inst.ID+"/logs?tail=200", sh.runnerToken, nil, &logs)
	approved := false
	for _, l := range logs.Lines {
		approved = approved || strings.Contains(l.Text, `": approved (`) && strings.Contains(l.Text, "the decision came by the bus")
	}
	if !approved {
		r.t.Errorf("the log does not show the approval arriving by the bus: %+v", logs.Lines)
	}
	root.End()
	r.expectTrace(root, spanOf(runner, "start agent"), spanOf(runner, "librarian approval"), in(librarian),
		spanOf(bus, "bus deliver sendMessage"), spanOf(runner, "librarian decision"))
}
