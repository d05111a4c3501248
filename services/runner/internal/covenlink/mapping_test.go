package covenlink

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

func describe(e *covenpb.MessageResponse) string {
	switch ev := e.GetEvent().(type) {
	case *covenpb.MessageResponse_Text:
		return "text " + ev.Text
	case *covenpb.MessageResponse_Thinking:
		return "thinking " + ev.Thinking
	case *covenpb.MessageResponse_ToolUse:
		return fmt.Sprintf("tool_use %s %s %s", ev.ToolUse.GetId(), ev.ToolUse.GetName(), ev.ToolUse.GetInputJson())
	case *covenpb.MessageResponse_ToolResult:
		return fmt.Sprintf("tool_result %s %v %s", ev.ToolResult.GetId(), ev.ToolResult.GetIsError(), ev.ToolResult.GetOutput())
	case *covenpb.MessageResponse_ToolState:
		return fmt.Sprintf("tool_state %s %s", ev.ToolState.GetId(), ev.ToolState.GetState())
	}
	return fmt.Sprintf("%T", e.GetEvent())
}

func TestMapUpdate(t *testing.T) {
	t.Parallel()
	update := func(u string) []byte { return []byte(`{"sessionId":"s","update":` + u + `}`) }
	for _, tt := range []struct {
		name string
		u    acp.Update
		want []string
	}{
		{"message chunk", acp.Update{Kind: acp.KindContent, Text: "hi"}, []string{"text hi"}},
		{"empty chunk", acp.Update{Kind: acp.KindContent}, nil},
		{"thought", acp.Update{Kind: acp.KindThought, Text: "hmm"}, []string{"thinking hmm"}},
		{"tool call with input", acp.Update{Kind: acp.KindToolCall, ToolCallID: "c1", ToolName: "Read",
			Raw: update(`{"sessionUpdate":"tool_call","toolCallId":"c1","title":"Read","kind":"read","rawInput":{"path":"/a"}}`)},
			[]string{`tool_use c1 Read {"path":"/a"}`}},
		{"tool call without a title or input", acp.Update{Kind: acp.KindToolCall, ToolCallID: "c1",
			Raw: update(`{"sessionUpdate":"tool_call","toolCallId":"c1","kind":"edit"}`)},
			[]string{"tool_use c1 edit {}"}},
		{"update with text content", acp.Update{Kind: acp.KindToolCallUpdate, ToolCallID: "c1", ToolStatus: "completed",
			Raw: update(`{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"out"}}],"rawOutput":{"x":1}}`)},
			[]string{"tool_result c1 false out"}},
		{"update with a diff", acp.Update{Kind: acp.KindToolCallUpdate, ToolCallID: "c1", ToolStatus: "completed",
			Raw: update(`{"sessionUpdate":"tool_call_update","toolCallId":"c1","content":[{"type":"diff","path":"/a","oldText":"x","newText":"y"}]}`)},
			[]string{"tool_result c1 false /a:\ny"}},
		{"failed update with raw output", acp.Update{Kind: acp.KindToolCallUpdate, ToolCallID: "c1", ToolStatus: "failed",
			Raw: update(`{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"failed","rawOutput":{"error":"no"}}`)},
			[]string{`tool_result c1 true {"error":"no"}`}},
		{"status alone", acp.Update{Kind: acp.KindToolCallUpdate, ToolCallID: "c1", ToolStatus: "in_progress",
			Raw: update(`{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"in_progress"}`)},
			[]string{"tool_state c1 TOOL_STATE_RUNNING"}},
		{"null raw output", acp.Update{Kind: acp.KindToolCallUpdate, ToolCallID: "c1",
			Raw: update(`{"sessionUpdate":"tool_call_update","toolCallId":"c1","rawOutput":null}`)}, nil},
		{"content of the wrong type", acp.Update{Kind: acp.KindToolCallUpdate, ToolCallID: "c1", ToolStatus: "completed",
			Raw: update(`{"sessionUpdate":"tool_call_update","toolCallId":"c1","status":"completed","content":"text"}`)},
			[]string{"tool_state c1 TOOL_STATE_COMPLETED"}},
		{"permission request", acp.Update{Kind: acp.KindPermissionRequest, ToolCallID: "c2",
			Raw: []byte(`{"sessionId":"s","toolCall":{"toolCallId":"c2"},"options":[]}`)},
			nil},
		{"plan", acp.Update{Kind: acp.KindPlan, Text: "1/2"}, nil},
		{"usage", acp.Update{Kind: acp.KindUsage, Text: "1 of 2 tokens"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, e := range mapUpdate(tt.u) {
				got = append(got, describe(e))
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestClipKeepsUTF8(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("é", maxToolJSON) // two bytes each
	got := clip(s[1:])
	if len(got) > maxToolJSON || !utf8.ValidString(got) {
		t.Fatalf("clip: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}

// FuzzMapUpdate: whatever an agent puts in an update, the mapping does
// not panic and its events can be sent (proto strings must be UTF-8).
func FuzzMapUpdate(f *testing.F) {
	f.Add("content", "", "\xed\xa0\x80", []byte("{}"))
	f.Add("tool_call_update", "completed", "x", []byte(`{"update":{"content":[{"type":"content","content":{"type":"text","text":"x"}}]}}`))
	f.Add("tool_call", "", "\xff", []byte(`{"update":{"rawInput":{"a":[1,2]}}}`))
	f.Add("permission_request", "", "", []byte(`{"toolCall":{"toolCallId":7}}`))
	f.Fuzz(func(t *testing.T, kind, status, text string, raw []byte) {
		if !utf8.Valid(raw) {
			// The runner drops lines that are not UTF-8 before they are
			// decoded.
			return
		}
		for _, e := range mapUpdate(acp.Update{Kind: kind, ToolStatus: status, ToolCallID: text, ToolName: text, Text: text, Raw: raw}) {
			if _, err := proto.Marshal(e); err != nil {
				t.Fatalf("event %v cannot be sent: %v", e, err)
			}
		}
	})
}
