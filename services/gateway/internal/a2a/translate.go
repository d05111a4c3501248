package a2a

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// Sender is the sender an A2A message reaches an agent with.
const Sender = "a2a"

// responseArtifact is the id of the artifact that collects an agent's text.
const responseArtifact a2a.ArtifactID = "response"

// maxParts bounds the parts of one message: the gateway's own limits (16
// attachments) are checked after, on what the parts become.
const maxParts = 64

// toRequest is an A2A message as a gateway SendMessageRequest: its text
// parts joined by newlines are the content; raw parts (files) and data
// parts (as JSON files) are the attachments. The gateway's limits on
// content and attachments are checked by the client API itself. A URL part
// is refused: the gateway fetches nothing on a caller's behalf.
func toRequest(agentID string, m *a2a.Message) (*gatewayv1.SendMessageRequest, error) {
	if m == nil {
		return nil, invalidParams("message is required")
	}
	if m.ID == "" {
		return nil, invalidParams("message.messageId is required")
	}
	if m.TaskID != "" {
		// A gateway task asks its client for nothing: the one wait it
		// shows (input-required) is a permission a person decides
		// elsewhere, so no message can continue a task.
		return nil, a2a.NewError(a2a.ErrUnsupportedOperation, "message.taskId: a gateway task takes no input from its client. "+
			"A task input-required waits for a person's permission decision: "+decideElsewhere+
			" To go on with the conversation, send a new message in the same contextId")
	}
	if len(m.Parts) == 0 {
		return nil, invalidParams("message.parts is empty")
	}
	if len(m.Parts) > maxParts {
		return nil, invalidParams(fmt.Sprintf("message has %d parts; at most %d are allowed", len(m.Parts), maxParts))
	}
	req := &gatewayv1.SendMessageRequest{AgentId: agentID, ThreadId: m.ContextID, Sender: Sender, IdempotencyKey: m.ID}
	var texts []string
	for i, p := range m.Parts {
		if p == nil {
			return nil, invalidParams(fmt.Sprintf("message.parts[%d] is null", i))
		}
		switch c := p.Content.(type) {
		case a2a.Text:
			texts = append(texts, string(c))
		case a2a.Raw:
			req.Attachments = append(req.Attachments, &covenpb.FileAttachment{
				Filename: fileName(p.Filename, i, ""), MimeType: mediaType(p.MediaType, "application/octet-stream"), Data: c,
			})
		case a2a.Data:
			data, err := json.Marshal(c.Value)
			if err != nil {
				return nil, invalidParams(fmt.Sprintf("message.parts[%d].data cannot be encoded as JSON", i))
			}
			req.Attachments = append(req.Attachments, &covenpb.FileAttachment{
				Filename: fileName(p.Filename, i, ".json"), MimeType: "application/json", Data: data,
			})
		case a2a.URL:
			return nil, a2a.NewError(a2a.ErrUnsupportedContentType, fmt.Sprintf("message.parts[%d]: url parts are not supported; send the file's bytes as a raw part", i))
		default:
			return nil, invalidParams(fmt.Sprintf("message.parts[%d] has no content", i))
		}
	}
	req.Content = strings.Join(texts, "\n")
	return req, nil
}

func fileName(name string, i int, ext string) string {
	if name != "" {
		return name
	}
	return fmt.Sprintf("part-%d%s", i, ext)
}

func mediaType(t, def string) string {
	if t != "" {
		return t
	}
	return def
}

func invalidParams(msg string) error { return a2a.NewError(a2a.ErrInvalidParams, msg) }

// translator turns one task's gateway events into A2A events, keeping what
// a snapshot of the task needs: its state and artifacts.
type translator struct {
	info    a2a.TaskInfo
	task    *a2a.Task
	working bool // a working status was sent
	text    bool // the response artifact has text
	files   int
	now     func() time.Time
	at      time.Time // when the event being translated happened, if known
}

func newTranslator(info a2a.TaskInfo, history []*a2a.Message, now func() time.Time) *translator {
	ts := now()
	return &translator{info: info, now: now, task: &a2a.Task{
		ID: info.TaskID, ContextID: info.ContextID, History: history,
		Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted, Timestamp: &ts},
	}}
}

// terminal reports whether the task has ended.
func (t *translator) terminal() bool { return t.task.Status.State.Terminal() }

// snapshot is the task as the events so far make it.
func (t *translator) snapshot() *a2a.Task {
	c := *t.task
	c.Artifacts = make([]*a2a.Artifact, 0, len(t.task.Artifacts))
	for _, a := range t.task.Artifacts {
		ac := *a
		ac.Parts = append(a2a.ContentParts(nil), a.Parts...)
		c.Artifacts = append(c.Artifacts, &ac)
	}
	c.History = append([]*a2a.Message(nil), t.task.History...)
	return &c
}

// status moves the task to state, with a message of parts from the agent.
func (t *translator) status(state a2a.TaskState, meta map[string]any, parts ...*a2a.Part) *a2a.TaskStatusUpdateEvent {
	var msg *a2a.Message
	if len(parts) > 0 {
		msg = a2a.NewMessageForTask(a2a.MessageRoleAgent, t.info, parts...)
		msg.Metadata = meta
	}
	ts := t.at
	if ts.IsZero() {
		ts = t.now()
	}
	t.task.Status = a2a.TaskStatus{State: state, Message: msg, Timestamp: &ts}
	return &a2a.TaskStatusUpdateEvent{TaskID: t.info.TaskID, ContextID: t.info.ContextID, Status: t.task.Status}
}

// artifact adds parts to the artifact id (a new one unless appending).
func (t *translator) artifact(id a2a.ArtifactID, name string, appending bool, parts ...*a2a.Part) *a2a.TaskArtifactUpdateEvent {
	var art *a2a.Artifact
	for _, a := range t.task.Artifacts {
		if a.ID == id {
			art = a
		}
	}
	if art == nil {
		art = &a2a.Artifact{ID: id, Name: name}
		t.task.Artifacts = append(t.task.Artifacts, art)
	}
	for _, p := range parts {
		// Text chunks of the response are kept as one part in snapshots.
		if last := len(art.Parts) - 1; last >= 0 && appending {
			if prev, ok := art.Parts[last].Content.(a2a.Text); ok {
				if next, ok := p.Content.(a2a.Text); ok {
					art.Parts[last] = a2a.NewTextPart(string(prev) + string(next))
					continue
				}
			}
		}
		art.Parts = append(art.Parts, p)
	}
	return &a2a.TaskArtifactUpdateEvent{TaskID: t.info.TaskID, ContextID: t.info.ContextID, Append: appending,
		Artifact: &a2a.Artifact{ID: id, Name: name, Parts: parts}}
}

// event is the A2A events of one agent event: text becomes the response
// artifact, a file an artifact of its own, thinking and tool calls status
// updates (working) with a text or a data part, and done, error and
// cancelled the task's end. file names a file whose data the history did
// not keep.
func (t *translator) event(ev *covenpb.MessageResponse, file *gatewayv1.AttachmentRef) []a2a.Event {
	if t.terminal() || ev == nil {
		return nil
	}
	var out []a2a.Event
	switch {
	case !t.working:
		t.working = true
		out = append(out, t.status(a2a.TaskStateWorking, nil))
	case t.task.Status.State == a2a.TaskStateInputRequired && artifactEvent(ev):
		// The wait is over: the agent goes on. (The other events are
		// status updates of their own, working or the end.)
		out = append(out, t.status(a2a.TaskStateWorking, nil))
	}
	data := func(kind string, v map[string]any) a2a.Event {
		return t.status(a2a.TaskStateWorking, map[string]any{"conclave_event": kind}, a2a.NewDataPart(map[string]any{kind: v}))
	}
	switch x := ev.GetEvent().(type) {
	case *covenpb.MessageResponse_Text:
		out = append(out, t.artifact(responseArtifact, "response", t.text, a2a.NewTextPart(x.Text)))
		t.text = true
	case *covenpb.MessageResponse_Thinking:
		out = append(out, t.status(a2a.TaskStateWorking, map[string]any{"conclave_event": "thinking"}, a2a.NewTextPart(x.Thinking)))
	case *covenpb.MessageResponse_ToolUse:
		var input any = x.ToolUse.GetInputJson()
		var parsed any
		if json.Unmarshal([]byte(x.ToolUse.GetInputJson()), &parsed) == nil {
			input = parsed
		}
		out = append(out, data("tool_use", map[string]any{"id": x.ToolUse.GetId(), "name": x.ToolUse.GetName(), "input": input}))
	case *covenpb.MessageResponse_ToolResult:
		out = append(out, data("tool_result", map[string]any{"id": x.ToolResult.GetId(), "output": x.ToolResult.GetOutput(), "is_error": x.ToolResult.GetIsError()}))
	case *covenpb.MessageResponse_ToolState:
		v := map[string]any{"id": x.ToolState.GetId(), "state": x.ToolState.GetState().String()}
		if x.ToolState.Detail != nil {
			v["detail"] = x.ToolState.GetDetail()
		}
		if x.ToolState.GetState() == covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL {
			out = append(out, t.status(a2a.TaskStateInputRequired, map[string]any{"conclave_event": "tool_state"},
				a2a.NewTextPart(awaitingText(x.ToolState)), a2a.NewDataPart(map[string]any{"tool_state": v})))
			break
		}
		out = append(out, data("tool_state", v))
	case *covenpb.MessageResponse_Usage:
		u := x.Usage
		out = append(out, data("usage", map[string]any{
			"input_tokens": u.GetInputTokens(), "output_tokens": u.GetOutputTokens(), "cache_read_tokens": u.GetCacheReadTokens(),
			"cache_write_tokens": u.GetCacheWriteTokens(), "thinking_tokens": u.GetThinkingTokens(),
		}))
	case *covenpb.MessageResponse_SessionInit:
		out = append(out, data("session_init", map[string]any{"session_id": x.SessionInit.GetSessionId()}))
	case *covenpb.MessageResponse_File:
		t.files++
		id := a2a.ArtifactID(fmt.Sprintf("file-%d", t.files))
		var p *a2a.Part
		if file != nil {
			// Read back from the history, which keeps no file data.
			p = a2a.NewDataPart(map[string]any{"file": map[string]any{"filename": file.GetFilename(), "mime_type": file.GetMimeType(), "size": file.GetSize(), "sha256": file.GetSha256()}})
		} else {
			p = a2a.NewRawPart(x.File.GetData())
			p.Filename, p.MediaType = x.File.GetFilename(), x.File.GetMimeType()
		}
		out = append(out, t.artifact(id, x.File.GetFilename(), false, p))
	case *covenpb.MessageResponse_Done:
		if full := x.Done.GetFullResponse(); full != "" && !t.text {
			out = append(out, t.artifact(responseArtifact, "response", false, a2a.NewTextPart(full)))
			t.text = true
		}
		out = append(out, t.status(a2a.TaskStateCompleted, nil))
	case *covenpb.MessageResponse_Error:
		out = append(out, t.status(a2a.TaskStateFailed, nil, a2a.NewTextPart(x.Error)))
	case *covenpb.MessageResponse_Cancelled:
		reason := x.Cancelled.GetReason()
		if reason == "" {
			reason = "canceled"
		}
		out = append(out, t.status(a2a.TaskStateCanceled, nil, a2a.NewTextPart(reason)))
	}
	return out
}

// artifactEvent reports whether ev becomes an artifact update, which
// does not change the task's state by itself.
func artifactEvent(ev *covenpb.MessageResponse) bool {
	switch ev.GetEvent().(type) {
	case *covenpb.MessageResponse_Text, *covenpb.MessageResponse_File:
		return true
	}
	return false
}

// decideElsewhere says where a permission wait is decided, and that an
// A2A message does not decide it.
const decideElsewhere = "It is decided where the agent's permission policy says (for a runner agent under the librarian policy: " +
	"the Librarian's review, on its review page or in the console), not by an A2A message; the task goes on once it is decided."

// awaitingText is the status text of a task whose tool call waits for a
// person's permission: which call, the agent's word on it, and where it is
// decided.
func awaitingText(ts *covenpb.ToolStateUpdate) string {
	text := fmt.Sprintf("The agent's tool call %q waits for a person's permission.", ts.GetId())
	if d := ts.GetDetail(); d != "" {
		text += " The agent says: " + strings.TrimRight(d, ". ") + "."
	}
	return text + " " + decideElsewhere
}

// ended is the task's end when its stream failed rather than the agent
// ending it (the agent disconnected, the replica stopped): failed, saying
// why.
func (t *translator) ended(err error) []a2a.Event {
	if t.terminal() {
		return nil
	}
	st := status.Convert(err)
	state := a2a.TaskStateFailed
	if st.Code() == codes.Canceled {
		state = a2a.TaskStateCanceled
	}
	return []a2a.Event{t.status(state, nil, a2a.NewTextPart(st.Message()))}
}

// entry is the A2A events of one stored entry of the task: its events as
// event says, and its outcome as the end, for a request that did not end
// with the agent's own terminal event.
func (t *translator) entry(e *gatewayv1.ThreadEntry) []a2a.Event {
	if e.GetTime() != nil {
		t.at = e.GetTime().AsTime()
		defer func() { t.at = time.Time{} }()
	}
	switch x := e.GetEntry().(type) {
	case *gatewayv1.ThreadEntry_Event:
		return t.event(x.Event, e.GetFile())
	case *gatewayv1.ThreadEntry_Outcome:
		o := x.Outcome
		switch o.GetEnding() {
		case gatewayv1.Ending_ENDING_DONE:
			return t.event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}}, nil)
		case gatewayv1.Ending_ENDING_CANCELLED:
			return t.ended(status.Error(codes.Canceled, nonEmpty(o.GetMessage(), "canceled")))
		default:
			return t.ended(status.Error(codes.Code(o.GetCode()), nonEmpty(o.GetMessage(), "the request failed")))
		}
	}
	return nil
}

func nonEmpty(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// userMessage is the client's message id of a task as the history keeps
// it: its text, and each attachment named by a data part (the history
// keeps no attachment data).
func userMessage(info a2a.TaskInfo, id string, m *gatewayv1.ClientMessage) *a2a.Message {
	parts := a2a.ContentParts{a2a.NewTextPart(m.GetContent())}
	for _, a := range m.GetAttachments() {
		parts = append(parts, a2a.NewDataPart(map[string]any{"attachment": map[string]any{
			"filename": a.GetFilename(), "mime_type": a.GetMimeType(), "size": a.GetSize(), "sha256": a.GetSha256(),
		}}))
	}
	msg := a2a.NewMessageForTask(a2a.MessageRoleUser, info, parts...)
	if id != "" {
		msg.ID = id
	}
	return msg
}
