package a2a

import (
	"encoding/json"
	"errors"
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
