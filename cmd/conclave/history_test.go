package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

func TestParseThreadsAndHistoryArgs(t *testing.T) {
	t.Parallel()
	vars := env(map[string]string{"CONCLAVE_TOKEN": "from-env"})
	threads, err := parseThreadsArgs([]string{"--limit", "3", "a1", "--addr=gw:1"}, vars, io.Discard)
	if want := (threadsOptions{gatewayFlags: gatewayFlags{"gw:1", "from-env"}, agentID: "a1", limit: 3}); err != nil || threads != want {
		t.Errorf("threads: got %+v, %v\nwant %+v", threads, err, want)
	}
	threads, err = parseThreadsArgs([]string{"a1"}, vars, io.Discard)
	if err != nil || threads.limit != 50 || threads.addr != "localhost:50051" {
		t.Errorf("threads defaults: %+v, %v", threads, err)
	}
	hist, err := parseHistoryArgs([]string{"th-1", "--after", "e9", "--token", "t"}, vars, io.Discard)
	if want := (historyOptions{gatewayFlags: gatewayFlags{"localhost:50051", "t"}, threadID: "th-1", after: "e9"}); err != nil || hist != want {
		t.Errorf("history: got %+v, %v\nwant %+v", hist, err, want)
	}

	for _, tt := range []struct {
		name string
		run  func() error
		want string
	}{
		{"threads without an agent", func() error { _, err := parseThreadsArgs(nil, vars, io.Discard); return err }, "give one agent ID"},
		{"threads with two agents", func() error { _, err := parseThreadsArgs([]string{"a", "b"}, vars, io.Discard); return err }, "give one agent ID"},
		{"threads with a zero limit", func() error {
			_, err := parseThreadsArgs([]string{"a", "--limit", "0"}, vars, io.Discard)
			return err
		}, "--limit must be positive"},
		{"history without a thread", func() error { _, err := parseHistoryArgs(nil, vars, io.Discard); return err }, "give one thread ID"},
		{"history with an unknown flag", func() error {
			_, err := parseHistoryArgs([]string{"th", "--bogus"}, vars, io.Discard)
			return err
		}, "bogus"},
	} {
		if err := tt.run(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	var usage bytes.Buffer
	if _, err := parseHistoryArgs([]string{"-h"}, vars, &usage); !errors.Is(err, flag.ErrHelp) || !strings.Contains(usage.String(), "conclave agent history THREAD") {
		t.Errorf("-h = %v, usage %q", err, usage.String())
	}
}

// entries is a thread of three requests, as History returns it: one
// answered, one the agent failed, one cut off by the agent leaving.
func entries() []*gatewayv1.ThreadEntry {
	at := timestamppb.New(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC))
	entry := func(req string, e any) *gatewayv1.ThreadEntry {
		te := &gatewayv1.ThreadEntry{ThreadId: "th", RequestId: req, AgentId: "a1", Time: at}
		switch e := e.(type) {
		case *gatewayv1.ClientMessage:
			te.Entry = &gatewayv1.ThreadEntry_Message{Message: e}
		case *covenpb.MessageResponse:
			te.Entry = &gatewayv1.ThreadEntry_Event{Event: e}
		case *gatewayv1.Outcome:
			te.Entry = &gatewayv1.ThreadEntry_Outcome{Outcome: e}
		}
		return te
	}
	file := entry("r1", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "echo.txt"}}})
	file.File = &gatewayv1.AttachmentRef{Filename: "echo.txt", MimeType: "text/plain", Size: 9}
	return []*gatewayv1.ThreadEntry{
		entry("r1", &gatewayv1.ClientMessage{Sender: "ada", Content: "hi there", ClientId: "token:0123",
			Attachments: []*gatewayv1.AttachmentRef{{Filename: "notes.md", Size: 2048}}}),
		entry("r1", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Thinking{Thinking: "Reading"}}),
		entry("r1", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "You said: "}}),
		entry("r1", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "hi there"}}),
		file,
		entry("r1", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "You said: hi there"}}}),
		entry("r1", &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_DONE}),
		entry("r2", &gatewayv1.ClientMessage{Content: "and again", ClientId: "token:0123"}),
		entry("r2", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "Half"}}),
		entry("r2", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Error{Error: "out of ideas"}}),
		entry("r2", &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_ERROR}),
		entry("r3", &gatewayv1.ClientMessage{Sender: "ada", Content: "last", ClientId: "token:0123"}),
		entry("r3", &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Text{Text: "Start"}}),
		entry("r3", &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_AGENT_GONE, Code: int32(codes.Unavailable), Message: "agent a1 disconnected"}),
	}
}

func TestConversationPrinterPrintsAThread(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := &conversationPrinter{reply: replyPrinter{w: &buf}}
	for _, e := range entries() {
		p.print(e)
	}
	p.reply.endLine()
	const want = `── ada → a1 · 2026-03-04 05:06:07 UTC
hi there
[attachment] notes.md (-, 2.0 KiB)
── a1
thinking: Reading
You said: hi there
[file] echo.txt (text/plain, 9 B; not kept)
── token:0123 → a1 · 2026-03-04 05:06:07 UTC
and again
── a1
Half
[error] out of ideas
── ada → a1 · 2026-03-04 05:06:07 UTC
last
── a1
Start
[cut off] agent a1 disconnected
`
	if buf.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", buf.String(), want)
	}
	if !p.any {
		t.Error("any is not set")
	}
}

func TestHistoryFailureNamesTheThread(t *testing.T) {
	t.Parallel()
	err := historyFailure(context.Background(), status.Error(codes.NotFound, `thread "th" not found`), "gw:1", "th")
	if want := `thread "th" not found on the gateway at gw:1, or it is another client's; 'conclave agent threads AGENT' lists yours`; err.Error() != want || status.Code(err) != codes.NotFound {
		t.Errorf("got  %q (%s)\nwant %q", err, status.Code(err), want)
	}
	err = historyFailure(context.Background(), status.Error(codes.Unimplemented, "this gateway keeps no history"), "gw:1", "th")
	if want := "gateway gw:1: this gateway keeps no history (Unimplemented)"; err.Error() != want {
		t.Errorf("got  %q\nwant %q", err, want)
	}
}
