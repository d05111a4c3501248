package a2a

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

func TestToRequest(t *testing.T) {
	t.Parallel()
	msg := func(parts ...*a2a.Part) *a2a.Message {
		m := a2a.NewMessage(a2a.MessageRoleUser, parts...)
		m.ID, m.ContextID = "m-1", "thread-1"
		return m
	}
	raw := a2a.NewRawPart([]byte("bytes"))
	raw.Filename, raw.MediaType = "a.bin", "application/x-test"
	cases := []struct {
		name    string
		msg     *a2a.Message
		want    string // content|attachment name:type:data...
		wantErr error
	}{
		{"text parts joined", msg(a2a.NewTextPart("a"), a2a.NewTextPart("b")), "a\nb", nil},
		{"a raw part", msg(a2a.NewTextPart("see"), raw), "see|a.bin:application/x-test:bytes", nil},
		{"an unnamed raw part", msg(a2a.NewRawPart([]byte("x"))), "|part-0:application/octet-stream:x", nil},
		{"a data part", msg(a2a.NewDataPart(map[string]any{"k": 1})), `|part-0.json:application/json:{"k":1}`, nil},
		{"a url part", msg(a2a.NewFileURLPart("http://169.254.169.254/", "text/plain")), "", a2a.ErrUnsupportedContentType},
		{"no parts", msg(), "", a2a.ErrInvalidParams},
		{"a nil part", msg(nil), "", a2a.ErrInvalidParams},
		{"too many parts", msg(make([]*a2a.Part, maxParts+1)...), "", a2a.ErrInvalidParams},
		{"no messageId", func() *a2a.Message { m := msg(a2a.NewTextPart("x")); m.ID = ""; return m }(), "", a2a.ErrInvalidParams},
		{"a taskId", func() *a2a.Message { m := msg(a2a.NewTextPart("x")); m.TaskID = "t"; return m }(), "", a2a.ErrUnsupportedOperation},
		{"no message", nil, "", a2a.ErrInvalidParams},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := toRequest("agent-1", c.msg)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("err = %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := []string{req.GetContent()}
			for _, a := range req.GetAttachments() {
				got = append(got, a.GetFilename()+":"+a.GetMimeType()+":"+string(a.GetData()))
			}
			if strings.Join(got, "|") != c.want {
				t.Fatalf("got %q, want %q", strings.Join(got, "|"), c.want)
			}
			if req.GetAgentId() != "agent-1" || req.GetThreadId() != "thread-1" || req.GetIdempotencyKey() != "m-1" || req.GetSender() != Sender {
				t.Fatalf("request: %v", req)
			}
		})
	}
}

// TestTranslatorFromEntries: a task read back from the history ends as
// its outcome says, with the entries' times, once.
func TestTranslatorFromEntries(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	entry := func(e *gatewayv1.ThreadEntry) *gatewayv1.ThreadEntry {
		e.Time = timestamp(at)
		return e
	}
	event := func(ev *covenpb.MessageResponse) *gatewayv1.ThreadEntry {
		return entry(&gatewayv1.ThreadEntry{Entry: &gatewayv1.ThreadEntry_Event{Event: ev}})
	}
	outcome := func(o *gatewayv1.Outcome) *gatewayv1.ThreadEntry {
		return entry(&gatewayv1.ThreadEntry{Entry: &gatewayv1.ThreadEntry_Outcome{Outcome: o}})
	}
	cases := []struct {
		name    string
		entries []*gatewayv1.ThreadEntry
		state   a2a.TaskState
		text    string
	}{
		{"done", []*gatewayv1.ThreadEntry{
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "a"}}),
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "b"}}),
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}}),
			outcome(&gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_DONE}),
		}, a2a.TaskStateCompleted, "ab"},
		{"the agent left", []*gatewayv1.ThreadEntry{
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "a"}}),
			outcome(&gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_AGENT_GONE, Code: 14, Message: "agent gone"}),
		}, a2a.TaskStateFailed, "a"},
		{"cancelled by the gateway", []*gatewayv1.ThreadEntry{
			outcome(&gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_CANCELLED}),
		}, a2a.TaskStateCanceled, ""},
		{"waiting for a person", []*gatewayv1.ThreadEntry{
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "a"}}),
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{
				Id: "call_2", State: covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL}}}),
		}, a2a.TaskStateInputRequired, "a"},
		{"still running", []*gatewayv1.ThreadEntry{
			event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_Thinking{Thinking: "hmm"}}),
		}, a2a.TaskStateWorking, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTranslator(a2a.TaskInfo{TaskID: "t", ContextID: "c"}, nil, time.Now)
			for _, e := range c.entries {
				tr.entry(e)
			}
			task := tr.snapshot()
			text := ""
			for _, a := range task.Artifacts {
				for _, p := range a.Parts {
					text += p.Text()
				}
			}
			if task.Status.State != c.state || text != c.text || !task.Status.Timestamp.Equal(at) {
				t.Fatalf("task: %s %q at %v", task.Status.State, text, task.Status.Timestamp)
			}
		})
	}
}

// FuzzToRequest: any message a client's JSON decodes to becomes a request
// or an A2A error, never a panic; a request has the message's id as its
// key and every attachment named.
func FuzzToRequest(f *testing.F) {
	for _, s := range []string{
		`{"messageId":"m","role":"ROLE_USER","parts":[{"text":"hi"}]}`,
		`{"messageId":"m","parts":[{"raw":"aGk="},{"data":{"a":[1,2]}},{"url":"http://x"}]}`,
		`{"messageId":"","parts":[]}`, `{"messageId":"m","taskId":"t","parts":[{"text":""}]}`,
		`{"messageId":"m","contextId":"c","parts":[{"raw":"","filename":"","mediaType":""}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m a2a.Message
		if json.Unmarshal(data, &m) != nil {
			return
		}
		req, err := toRequest("agent", &m)
		if err != nil {
			var e *a2a.Error
			if !errors.As(err, &e) || e.Message == "" {
				t.Fatalf("%s: not an A2A error: %v", data, err)
			}
			return
		}
		if req.GetIdempotencyKey() != m.ID || m.ID == "" {
			t.Fatalf("%s: key %q", data, req.GetIdempotencyKey())
		}
		for _, a := range req.GetAttachments() {
			if a.GetFilename() == "" || a.GetMimeType() == "" {
				t.Fatalf("%s: attachment %v", data, a)
			}
		}
	})
}

func timestamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// TestTranslatorInputRequired: a tool call awaiting approval (a permission
// a person decides) makes the task input-required, saying which call
// waits and where it is decided; the agent's next event, whatever it is,
// makes it working again, or ends it.
func TestTranslatorInputRequired(t *testing.T) {
	t.Parallel()
	detail := "waiting for a person to decide this permission request in the Librarian's review"
	awaiting := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{
		Id: "call_2", State: covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL, Detail: &detail}}}
	toolState := func(s covenpb.ToolState) *covenpb.MessageResponse {
		return &covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{Id: "call_2", State: s}}}
	}
	text := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "done it"}}
	file := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "a.txt", MimeType: "text/plain", Data: []byte("a")}}}
	thinking := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Thinking{Thinking: "hmm"}}
	result := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{Id: "call_2", Output: "ok"}}}
	done := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}}
	failed := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Error{Error: "boom"}}
	cancelled := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Cancelled{Cancelled: &covenpb.Cancelled{Reason: "canceled by its A2A client"}}}
	cases := []struct {
		name   string
		events []*covenpb.MessageResponse
		// want is the events of the last agent event: "status:<state>" or
		// "artifact:<id>"; final the task's state after them.
		want  []string
		final a2a.TaskState
	}{
		{"the wait", []*covenpb.MessageResponse{thinking, awaiting}, []string{"status:TASK_STATE_INPUT_REQUIRED"}, a2a.TaskStateInputRequired},
		{"the wait as the first event", []*covenpb.MessageResponse{awaiting},
			[]string{"status:TASK_STATE_WORKING", "status:TASK_STATE_INPUT_REQUIRED"}, a2a.TaskStateInputRequired},
		{"decided: the tool runs", []*covenpb.MessageResponse{thinking, awaiting, toolState(covenpb.ToolState_TOOL_STATE_RUNNING)},
			[]string{"status:TASK_STATE_WORKING"}, a2a.TaskStateWorking},
		{"decided: refused", []*covenpb.MessageResponse{thinking, awaiting, toolState(covenpb.ToolState_TOOL_STATE_DENIED)},
			[]string{"status:TASK_STATE_WORKING"}, a2a.TaskStateWorking},
		{"completed", []*covenpb.MessageResponse{thinking, awaiting, toolState(covenpb.ToolState_TOOL_STATE_COMPLETED)},
			[]string{"status:TASK_STATE_WORKING"}, a2a.TaskStateWorking},
		{"failed tool", []*covenpb.MessageResponse{thinking, awaiting, toolState(covenpb.ToolState_TOOL_STATE_FAILED)},
			[]string{"status:TASK_STATE_WORKING"}, a2a.TaskStateWorking},
		{"a tool result", []*covenpb.MessageResponse{thinking, awaiting, result}, []string{"status:TASK_STATE_WORKING"}, a2a.TaskStateWorking},
		{"text", []*covenpb.MessageResponse{thinking, awaiting, text},
			[]string{"status:TASK_STATE_WORKING", "artifact:response"}, a2a.TaskStateWorking},
		{"a file", []*covenpb.MessageResponse{thinking, awaiting, file},
			[]string{"status:TASK_STATE_WORKING", "artifact:file-1"}, a2a.TaskStateWorking},
		{"text while working", []*covenpb.MessageResponse{thinking, text}, []string{"artifact:response"}, a2a.TaskStateWorking},
		{"canceled during the wait", []*covenpb.MessageResponse{thinking, awaiting, cancelled}, []string{"status:TASK_STATE_CANCELED"}, a2a.TaskStateCanceled},
		{"done during the wait", []*covenpb.MessageResponse{thinking, awaiting, done}, []string{"status:TASK_STATE_COMPLETED"}, a2a.TaskStateCompleted},
		{"failed during the wait", []*covenpb.MessageResponse{thinking, awaiting, failed}, []string{"status:TASK_STATE_FAILED"}, a2a.TaskStateFailed},
		{"waiting again", []*covenpb.MessageResponse{thinking, awaiting, toolState(covenpb.ToolState_TOOL_STATE_RUNNING), awaiting},
			[]string{"status:TASK_STATE_INPUT_REQUIRED"}, a2a.TaskStateInputRequired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTranslator(a2a.TaskInfo{TaskID: "t", ContextID: "c"}, nil, time.Now)
			var last []a2a.Event
			for _, e := range c.events {
				last = tr.event(e, nil)
			}
			var got []string
			for _, e := range last {
				switch x := e.(type) {
				case *a2a.TaskStatusUpdateEvent:
					got = append(got, "status:"+string(x.Status.State))
				case *a2a.TaskArtifactUpdateEvent:
					got = append(got, "artifact:"+string(x.Artifact.ID))
				default:
					got = append(got, fmt.Sprintf("%T", e))
				}
			}
			if strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Fatalf("events %v, want %v", got, c.want)
			}
			if st := tr.snapshot().Status.State; st != c.final {
				t.Fatalf("the task is %s, want %s", st, c.final)
			}
		})
	}
}

// TestInputRequiredStatus: the input-required status says which tool call
// waits, the agent's word on it, and where it is decided, as text and as
// the tool_state data part.
func TestInputRequiredStatus(t *testing.T) {
	t.Parallel()
	detail := "waiting for a person to decide this permission request in the Librarian's review, until 2026-11-28T12:00:00Z"
	cases := []struct {
		name     string
		detail   *string
		wantText []string
		wantData map[string]any
	}{
		{"with the runner's detail", &detail,
			[]string{`tool call "call_2"`, "The agent says: " + detail + ".", "the Librarian's review", "not by an A2A message"},
			map[string]any{"id": "call_2", "state": "TOOL_STATE_AWAITING_APPROVAL", "detail": detail}},
		{"a coven agent's, without detail", nil,
			[]string{`tool call "call_2"`, "permission policy", "not by an A2A message"},
			map[string]any{"id": "call_2", "state": "TOOL_STATE_AWAITING_APPROVAL"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := newTranslator(a2a.TaskInfo{TaskID: "t", ContextID: "c"}, nil, time.Now)
			evs := tr.event(&covenpb.MessageResponse{Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{
				Id: "call_2", State: covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL, Detail: c.detail}}}, nil)
			u, ok := evs[len(evs)-1].(*a2a.TaskStatusUpdateEvent)
			if !ok || u.Status.State != a2a.TaskStateInputRequired || u.Status.Message == nil || len(u.Status.Message.Parts) != 2 {
				t.Fatalf("events %+v", evs)
			}
			msg := u.Status.Message
			if msg.Role != a2a.MessageRoleAgent || msg.TaskID != "t" || msg.Metadata["conclave_event"] != "tool_state" {
				t.Errorf("message %+v", msg)
			}
			for _, w := range c.wantText {
				if !strings.Contains(msg.Parts[0].Text(), w) {
					t.Errorf("the text %q lacks %q", msg.Parts[0].Text(), w)
				}
			}
			data, _ := json.Marshal(msg.Parts[1].Data())
			want, _ := json.Marshal(map[string]any{"tool_state": c.wantData})
			if string(data) != string(want) {
				t.Errorf("data %s, want %s", data, want)
			}
		})
	}
}

// TestInterrupted: a blocking SendMessage stops at input-required only.
func TestInterrupted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ev   a2a.Event
		want bool
	}{
		{&a2a.TaskStatusUpdateEvent{Status: a2a.TaskStatus{State: a2a.TaskStateInputRequired}}, true},
		{&a2a.TaskStatusUpdateEvent{Status: a2a.TaskStatus{State: a2a.TaskStateWorking}}, false},
		{&a2a.TaskStatusUpdateEvent{Status: a2a.TaskStatus{State: a2a.TaskStateCompleted}}, false},
		{&a2a.Task{Status: a2a.TaskStatus{State: a2a.TaskStateInputRequired}}, false},
		{&a2a.TaskArtifactUpdateEvent{}, false},
	} {
		if got := interrupted(c.ev); got != c.want {
			t.Errorf("interrupted(%T %+v) = %v", c.ev, c.ev, got)
		}
	}
}
