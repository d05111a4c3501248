package covenlink

import (
	"encoding/json"
	"strings"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// maxToolJSON bounds a tool call's input or output sent as one event: an
// agent may put a whole file in either.
const maxToolJSON = 64 << 10

// mapUpdate is the coven events of one update of a turn (none for the
// updates coven has no event for: plans, commands, modes, usage...).
func mapUpdate(u acp.Update) []*covenpb.MessageResponse {
	// What the agent wrote goes into proto strings, which must be UTF-8;
	// a JSON escape of a lone surrogate would not be.
	u.Text, u.ToolCallID, u.ToolName = utf8Only(u.Text), utf8Only(u.ToolCallID), utf8Only(u.ToolName)
	switch u.Kind {
	case acp.KindContent:
		if u.Text == "" {
			return nil
		}
		return []*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_Text{Text: u.Text}}}
	case acp.KindThought:
		if u.Text == "" {
			return nil
		}
		return []*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_Thinking{Thinking: u.Text}}}
	case acp.KindToolCall:
		tc := toolCallOf(u)
		input := "{}"
		if len(tc.RawInput) > 0 {
			input = clip(string(tc.RawInput))
		}
		return []*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{
			Id: u.ToolCallID, Name: firstNonEmpty(u.ToolName, utf8Only(tc.Kind), "tool"), InputJson: input}}}}
	case acp.KindToolCallUpdate:
		tc := toolCallOf(u)
		if out, ok := tc.output(); ok {
			return []*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{
				Id: u.ToolCallID, Output: out, IsError: u.ToolStatus == "failed"}}}}
		}
		if st, ok := toolStates[u.ToolStatus]; ok {
			return []*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{
				Id: u.ToolCallID, State: st}}}}
		}
	}
	// A permission request is no event of its own: the type's policy, or
	// the Librarian, answers it. Only a wait for a person is the tool's
	// AWAITING_APPROVAL, which the runner sends when the Librarian
	// escalates the request (Link.ToolState).
	return nil
}

// toolStates are an ACP tool call's statuses as coven tool states.
var toolStates = map[string]covenpb.ToolState{
	"pending":     covenpb.ToolState_TOOL_STATE_PENDING,
	"in_progress": covenpb.ToolState_TOOL_STATE_RUNNING,
	"completed":   covenpb.ToolState_TOOL_STATE_COMPLETED,
	"failed":      covenpb.ToolState_TOOL_STATE_FAILED,
}

// toolCall is what the mapping reads of an ACP tool_call or
// tool_call_update beyond what the runner decodes.
type toolCall struct {
	Kind      string          `json:"kind"`
	RawInput  json.RawMessage `json:"rawInput"`
	RawOutput json.RawMessage `json:"rawOutput"`
	Content   []struct {
		Type    string `json:"type"`
		Content struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Path    string `json:"path"`
		NewText string `json:"newText"`
	} `json:"content"`
}

func toolCallOf(u acp.Update) toolCall {
	var p struct {
		Update toolCall `json:"update"`
	}
	// An update the runner decoded is valid JSON; a member of an
	// unexpected type leaves its field empty.
	_ = json.Unmarshal(u.Raw, &p)
	return p.Update
}

// output is a tool call update's output: the text of its content, else
// its rawOutput; ok is false when it carries neither.
func (tc toolCall) output() (string, bool) {
	var b strings.Builder
	for _, c := range tc.Content {
		switch {
		case c.Type == "content" && c.Content.Type == "text":
			b.WriteString(c.Content.Text)
		case c.Type == "diff":
			b.WriteString(c.Path + ":\n" + c.NewText)
		}
	}
	if b.Len() > 0 {
		return clip(b.String()), true
	}
	if len(tc.RawOutput) > 0 && string(tc.RawOutput) != "null" {
		return clip(string(tc.RawOutput)), true
	}
	return "", false
}

// clip cuts s to maxToolJSON bytes, dropping a rune cut in two.
func clip(s string) string {
	if len(s) <= maxToolJSON {
		return utf8Only(s)
	}
	return strings.ToValidUTF8(s[:maxToolJSON], "")
}

func utf8Only(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
