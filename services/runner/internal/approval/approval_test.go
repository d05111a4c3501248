package approval

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/coder/acp-go-sdk"
)

// toolCall decodes a request_permission's toolCall as an agent sends it.
func toolCall(t *testing.T, js string) sdk.ToolCallUpdate {
	t.Helper()
	var tc sdk.ToolCallUpdate
	if err := json.Unmarshal([]byte(js), &tc); err != nil {
		t.Fatal(err)
	}
	return tc
}

func TestRequest(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name                     string
		toolCall                 string
		said                     string
		action, targetType, path string
		deviations               int
		contentHas, rationaleHas string
	}{
		{name: "the npm example agent's edit, outside the workspace",
			toolCall: `{"toolCallId":"call_2","title":"Modifying critical configuration file","kind":"edit","status":"pending",
				"locations":[{"path":"/home/user/project/config.json"}],"rawInput":{"path":"/home/user/project/config.json","content":"{\"database\": {\"host\": \"new-host\"}}"}}`,
			said:   "I'll help you with that. Now I understand the project structure. I need to make some changes to improve it.",
			action: "modify", targetType: "code", deviations: 1,
			contentHas: "Tool call: Modifying critical configuration file\nKind: edit\nFiles: /home/user/project/config.json", rationaleHas: "I need to make some changes"},
		{name: "an edit of an existing file", toolCall: `{"toolCallId":"c","title":"edit main","kind":"edit","locations":[{"path":"` + ws + `/main.go"}]}`,
			action: "modify", targetType: "code", path: "main.go", rationaleHas: "The agent gave no reason."},
		{name: "an edit of a missing file", toolCall: `{"toolCallId":"c","title":"add","kind":"edit","locations":[{"path":"` + ws + `/pkg/new.go"}]}`,
			action: "create", targetType: "code", path: "pkg/new.go"},
		{name: "a diff for a new document", toolCall: `{"toolCallId":"c","title":"write docs","kind":"edit",
				"content":[{"type":"diff","path":"` + ws + `/docs/guide.md","newText":"# Guide\n\n## Overview\nHow."}]}`,
			action: "create", targetType: "docs", path: "docs/guide.md", contentHas: "Content of the new file " + ws + "/docs/guide.md:\n# Guide\n\n## Overview"},
		{name: "a diff of a test", toolCall: `{"toolCallId":"c","title":"fix test","kind":"edit",
				"content":[{"type":"diff","path":"` + ws + `/pkg/x_test.go","oldText":"a","newText":"b"}]}`,
			action: "modify", targetType: "test", path: "pkg/x_test.go"},
		{name: "a design document deleted", toolCall: `{"toolCallId":"c","title":"rm","kind":"delete","locations":[{"path":"` + ws + `/docs/design/a.md"}]}`,
			action: "delete", targetType: "design", path: "docs/design/a.md"},
		{name: "a read", toolCall: `{"toolCallId":"c","title":"read","kind":"read","locations":[{"path":"` + ws + `/README.md"}]}`,
			action: "read", targetType: "docs", path: "README.md"},
		{name: "a command, its reason in its input", toolCall: `{"toolCallId":"c","title":"make test","kind":"execute","rawInput":{"command":"make test","description":"run the tests"}}`,
			action: "modify", targetType: "code", rationaleHas: "run the tests", contentHas: `Input: {"command":"make test","description":"run the tests"}`},
		{name: "no kind, a relative path", toolCall: `{"toolCallId":"c","locations":[{"path":"relative/x"}]}`,
			action: "modify", targetType: "code", deviations: 1, contentHas: "Kind: other"},
		{name: "too many outside", toolCall: `{"toolCallId":"c","kind":"edit","locations":[{"path":"/a"},{"path":"/b"},{"path":"/c"},{"path":"/d"}]}`,
			action: "modify", targetType: "code", deviations: maxDeviations},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := Input{AgentType: "npm-example", InstanceID: "inst-1", TaskID: "task-1", Turn: 2, Workspace: ws, Local: ws, ToolCall: toolCall(t, tt.toolCall), Said: tt.said}
			req, key := Request(in)
			if req.AgentId != "npm-example" || req.SessionId != "inst-1" || req.RequestType != "APPROVAL" {
				t.Fatalf("identity %+v", req)
			}
			if req.Action != tt.action || req.TargetType != tt.targetType || req.GetTargetPath() != tt.path {
				t.Fatalf("action %s, target_type %s, target_path %q", req.Action, req.TargetType, req.GetTargetPath())
			}
			if len(req.Deviations) != tt.deviations {
				t.Fatalf("deviations %v", req.Deviations)
			}
			if !strings.Contains(req.Content, tt.contentHas) || !strings.Contains(req.Content, "runner instance inst-1, task task-1, turn 2") {
				t.Fatalf("content %q", req.Content)
			}
			if req.Rationale == "" || !strings.Contains(req.Rationale, tt.rationaleHas) {
				t.Fatalf("rationale %q", req.Rationale)
			}
			if strings.Join(req.ContextUsed, "|") != "runner instance inst-1|task task-1|turn 2|tool call c" && !strings.Contains(tt.name, "npm") {
				t.Fatalf("context_used %v", req.ContextUsed)
			}
			again, key2 := Request(in)
			if key2 != key || again.Content != req.Content {
				t.Fatal("the same request gives another key")
			}
			in.Turn = 3
			if _, key3 := Request(in); key3 == key {
				t.Fatal("another turn gives the same key")
			}
		})
	}
}

func TestClip(t *testing.T) {
	t.Parallel()
	if got := clip("héllo", 2); got != "h…" {
		t.Errorf("clip %q", got)
	}
	if got := clipStart("héllo", 4); got != "…llo" {
		t.Errorf("clipStart %q", got)
	}
	long := strings.Repeat("x", 3*maxContent)
	req, _ := Request(Input{ToolCall: toolCall(t, `{"toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"`+long+`"}}]}`)})
	if len(req.Content) > maxContent+len("…") {
		t.Errorf("content of %d bytes", len(req.Content))
	}
}
