// Package approval turns an agent's ACP permission request into the
// Librarian's APPROVAL request (docs/governance.md has the mapping): what
// the tool call does, to which files, why, and which run asks.
package approval

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	sdk "github.com/coder/acp-go-sdk"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// Input is a permission request and the run that makes it.
type Input struct {
	// AgentType is the Librarian's agent_id: the runner's agent types are
	// its registry's agents.
	AgentType  string
	InstanceID string
	TaskID     string
	// Turn is the instance's durable turn number.
	Turn int
	// Workspace is the agent's workspace as the agent sees it: its paths
	// are made relative to it.
	Workspace string
	// Local is the same workspace on the runner's host, when it has it: a
	// file's existing there tells a modify from a create when the tool
	// call does not say.
	Local    string
	ToolCall sdk.ToolCallUpdate
	// Said is what the agent said in its turn before it asked: its stated
	// reason, when the tool call gives none.
	Said string
}

// Limits on what goes to the Librarian: under its default max_content_size
// (100 KB) and every registry entry's max_request_size, with room for the
// rest of the request.
const (
	maxContent   = 32 << 10
	maxInput     = 8 << 10
	maxRationale = 2 << 10
	maxFiles     = 20
	// maxDeviations stays under the protocol's default max_deviations (5).
	maxDeviations = 3
)

// Request builds the APPROVAL request for in and its idempotency key: the
// same permission request of the same turn (asked again by an agent whose
// runner restarted) is the same key, so the same Librarian request.
func Request(in Input) (*librarianv1.AgentRequest, string) {
	tc := in.ToolCall
	kind := ""
	if tc.Kind != nil {
		kind = string(*tc.Kind)
	}
	title := ""
	if tc.Title != nil {
		title = *tc.Title
	}
	files := touched(tc)
	var inside, outside []string
	for _, f := range files {
		if rel, ok := relative(in.Workspace, f); ok {
			inside = append(inside, rel)
		} else {
			outside = append(outside, f)
		}
	}
	target := ""
	if len(inside) > 0 {
		target = inside[0]
	}
	req := &librarianv1.AgentRequest{
		AgentId:     in.AgentType,
		SessionId:   in.InstanceID,
		RequestType: "APPROVAL",
		Action:      action(kind, tc, target, in.Local),
		TargetType:  targetType(target),
		Content:     content(in, kind, title, files),
		Rationale:   rationale(tc, in.Said),
		ContextUsed: []string{"runner instance " + in.InstanceID, "task " + in.TaskID, fmt.Sprintf("turn %d", in.Turn), "tool call " + string(tc.ToolCallId)},
	}
	if target != "" {
		req.TargetPath = proto.String(target)
	}
	for i, f := range outside {
		if i == maxDeviations {
			break
		}
		d, _ := structpb.NewStruct(map[string]any{"rule": "outside_workspace", "path": clip(f, 512),
			"description": "the tool call touches a path outside the instance's workspace"})
		req.Deviations = append(req.Deviations, d)
	}
	return req, key(in, kind, title, files)
}

// touched lists the files a tool call names: its locations, then the
// paths of its diffs, each once.
func touched(tc sdk.ToolCallUpdate) []string {
	var files []string
	add := func(p string) {
		if p != "" && len(files) < maxFiles && !slices.Contains(files, p) {
			files = append(files, p)
		}
	}
	for _, l := range tc.Locations {
		add(l.Path)
	}
	for _, c := range tc.Content {
		if c.Diff != nil {
			add(c.Diff.Path)
		}
	}
	return files
}

// relative is p relative to the workspace, if it lies inside it and is
// one the Librarian takes as a target_path (clean, no "..", no control
// characters).
func relative(workspace, p string) (string, bool) {
	if workspace == "" || !filepath.IsAbs(p) {
		return "", false
	}
	rel, err := filepath.Rel(filepath.Clean(workspace), filepath.Clean(p))
	if err != nil || !filepath.IsLocal(rel) || rel == "." {
		return "", false
	}
	rel = filepath.ToSlash(rel)
	if strings.ContainsFunc(rel, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }) || !utf8.ValidString(rel) || len(rel) > 1024 {
		return "", false
	}
	return rel, true
}

// action is the Librarian's action for a tool call of kind: reading kinds
// read, delete deletes, an edit creates a file that is not there (a diff
// without old text, or a file missing from the workspace) and modifies
// one that is; anything else (execute, move, other) modifies.
func action(kind string, tc sdk.ToolCallUpdate, target, local string) string {
	switch sdk.ToolKind(kind) {
	case sdk.ToolKindRead, sdk.ToolKindSearch, sdk.ToolKindFetch, sdk.ToolKindThink:
		return "read"
	case sdk.ToolKindDelete:
		return "delete"
	case sdk.ToolKindEdit:
		for _, c := range tc.Content {
			if c.Diff != nil {
				if c.Diff.OldText == nil {
					return "create"
				}
				return "modify"
			}
		}
		if target != "" && local != "" {
			if _, err := os.Lstat(filepath.Join(local, filepath.FromSlash(target))); os.IsNotExist(err) {
				return "create"
			}
		}
	}
	return "modify"
}

// targetType is the Librarian's target type of a workspace path: tests,
// architecture and design documents, other documentation, else code.
func targetType(rel string) string {
	if rel == "" {
		return "code"
	}
	lower := strings.ToLower(rel)
	base := path.Base(lower)
	dirs := strings.Split(path.Dir(lower), "/")
	switch {
	case strings.HasSuffix(strings.TrimSuffix(base, path.Ext(base)), "_test"), strings.HasPrefix(base, "test_"),
		strings.Contains(base, ".test."), strings.Contains(base, ".spec."),
		slices.ContainsFunc(dirs, func(d string) bool { return d == "test" || d == "tests" || d == "__tests__" || d == "spec" }):
		return "test"
	case strings.HasPrefix(lower, "docs/architecture/"):
		return "architecture"
	case strings.HasPrefix(lower, "docs/design/"):
		return "design"
	case slices.Contains([]string{".md", ".markdown", ".rst", ".adoc", ".txt"}, path.Ext(base)), dirs[0] == "docs" || dirs[0] == "doc":
		return "docs"
	}
	return "code"
}

// content is what the agent wants to do, for the reviewer and the
// Librarian's rules: the tool call's title, kind and files, which run asks,
// then its content (a diff's new text in full, so that a document is
// checked against its template) and its raw input.
func content(in Input, kind, title string, files []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Tool call: %s\nKind: %s\n", oneLine(title), firstNonEmpty(kind, "other"))
	if len(files) > 0 {
		fmt.Fprintf(&b, "Files: %s\n", oneLine(strings.Join(files, ", ")))
	}
	fmt.Fprintf(&b, "Asked by: agent type %s, runner instance %s, task %s, turn %d, tool call %s\n",
		in.AgentType, in.InstanceID, in.TaskID, in.Turn, oneLine(string(in.ToolCall.ToolCallId)))
	for _, c := range in.ToolCall.Content {
		switch {
		case c.Diff != nil:
			verb := "New content of"
			if c.Diff.OldText == nil {
				verb = "Content of the new file"
			}
			fmt.Fprintf(&b, "\n%s %s:\n%s\n", verb, oneLine(c.Diff.Path), c.Diff.NewText)
		case c.Content != nil && c.Content.Content.Text != nil:
			fmt.Fprintf(&b, "\n%s\n", c.Content.Content.Text.Text)
		case c.Terminal != nil:
			fmt.Fprintf(&b, "\nTerminal %s\n", oneLine(c.Terminal.TerminalId))
		}
	}
	if in.ToolCall.RawInput != nil {
		if raw, err := json.Marshal(in.ToolCall.RawInput); err == nil {
			fmt.Fprintf(&b, "\nInput: %s\n", clip(string(raw), maxInput))
		}
	}
	return clip(strings.ToValidUTF8(strings.ReplaceAll(b.String(), "\x00", ""), "\uFFFD"), maxContent)
}

// rationale is the agent's stated reason: one its tool input gives (a
// reason, rationale, description or explanation), else what it said in
// its turn before it asked.
func rationale(tc sdk.ToolCallUpdate, said string) string {
	if m, ok := tc.RawInput.(map[string]any); ok {
		for _, k := range []string{"reason", "rationale", "description", "explanation"} {
			if s, ok := m[k].(string); ok && strings.TrimSpace(s) != "" {
				return clip(strings.TrimSpace(s), maxRationale)
			}
		}
	}
	if s := strings.TrimSpace(said); s != "" {
		return clipStart(s, maxRationale)
	}
	return "The agent gave no reason."
}

// key is the idempotency key: the instance, the turn and a digest of the
// tool call, so that only the same request of the same turn repeats it.
func key(in Input, kind, title string, files []string) string {
	h := sha256.New()
	for _, s := range append([]string{string(in.ToolCall.ToolCallId), kind, title}, files...) {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	if raw, err := json.Marshal(in.ToolCall.RawInput); err == nil {
		h.Write(raw)
	}
	return fmt.Sprintf("runner/%s/%d/%s", in.InstanceID, in.Turn, hex.EncodeToString(h.Sum(nil))[:24])
}

func oneLine(s string) string {
	return clip(strings.Join(strings.Fields(s), " "), 512)
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// clip keeps the first n bytes of s, on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// clipStart keeps the last n bytes of s, on a rune boundary: the latest of
// what an agent said is nearest its request.
func clipStart(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return "…" + s[i:]
}
