package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// errNotYet answers updates sent before initialize: the session they claim
// to belong to does not exist yet.
var errNotYet = &jsonrpc.Error{Code: jsonrpc.InvalidRequest, Message: "Invalid Request: initialize has not completed"}

type kandevUpdate struct {
	Type string `json:"type"`
	Data struct {
		Text      string `json:"text"`
		ToolName  string `json:"toolName"`
		Status    string `json:"status"`
		SessionID string `json:"sessionId"`
		Success   bool   `json:"success"`
		Summary   string `json:"summary"`
		Message   string `json:"message"`
		Details   string `json:"details"`
		Progress  *int   `json:"progress"`
	} `json:"data"`
}

func (c *Client) handleUpdate(ctx context.Context, req *jsonrpc.Request) (any, error) {
	if !c.initialized.Load() {
		c.opts.OnDrop(DropEarly)
		return nil, errNotYet
	}
	var (
		u   Update
		err error
	)
	if c.Dialect() == DialectACP {
		u, err = decodeACP(req.Params)
	} else {
		u, err = decodeKandev(req.Params)
	}
	if err != nil {
		c.opts.OnDrop(DropBadUpdate)
		return nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: "Invalid params: " + err.Error()}
	}
	u.Raw, u.Replay = req.Params, c.loading.Load()
	c.opts.OnUpdate(ctx, u)
	switch u.Kind {
	case KindComplete:
		if u.Success {
			c.endTurn(Turn{StopReason: StopEndTurn, Message: u.Text})
		} else {
			c.endTurn(Turn{StopReason: StopError, Message: u.Text})
		}
	case KindError:
		c.endTurn(Turn{StopReason: StopError, Message: u.Text})
	}
	return nil, nil
}

// decodeACP reads an ACP session/update with the walker of scan.go rather
// than encoding/json or the SDK's SessionUpdate (whose union decoding parses
// every notification three times): this is the runner's hot path (see
// docs/runner.md and bench_test.go).
func decodeACP(params []byte) (Update, error) {
	u := Update{Progress: -1}
	var (
		update []byte
		err    error
	)
	if err = eachMember(params, func(k, v []byte) bool {
		if string(k) == "update" {
			update = v
			return false
		}
		return true
	}); err != nil {
		return Update{}, err
	}
	if update == nil {
		return Update{}, errors.New("update is missing")
	}
	var (
		kind, content, entries []byte
	)
	if err = eachMember(update, func(k, v []byte) bool {
		switch string(k) {
		case "sessionUpdate":
			kind = v
		case "content":
			content = v
		case "toolCallId":
			u.ToolCallID = str(v)
		case "title":
			u.ToolName = str(v)
		case "status":
			u.ToolStatus = str(v)
		case "entries":
			entries = v
		}
		return true
	}); err != nil {
		return Update{}, err
	}
	switch str(kind) {
	case "agent_message_chunk", "agent_thought_chunk":
		u.Kind = KindContent
		if str(kind) == "agent_thought_chunk" {
			u.Kind = KindThought
		}
		if len(content) > 0 && content[0] == '{' {
			if err := eachMember(content, func(k, v []byte) bool {
				if string(k) == "text" {
					u.Text = str(v)
					return false
				}
				return true
			}); err != nil {
				return Update{}, err
			}
		}
	case "tool_call":
		u.Kind = KindToolCall
	case "tool_call_update":
		u.Kind = KindToolCallUpdate
	case "plan":
		u.Kind = KindPlan
		total, done := 0, 0
		if len(entries) > 0 && entries[0] == '[' {
			err := eachElem(entries, func(e []byte) {
				total++
				_ = eachMember(e, func(k, v []byte) bool {
					if string(k) == "status" && str(v) == "completed" {
						done++
					}
					return true
				})
			})
			if err != nil {
				return Update{}, err
			}
		}
		if total > 0 {
			u.Progress = done * 100 / total
		}
	case "":
		return Update{}, errors.New("update.sessionUpdate is missing")
	default:
		u.Kind = KindOther
	}
	return u, nil
}

func decodeKandev(params []byte) (Update, error) {
	var n kandevUpdate
	if err := json.Unmarshal(params, &n); err != nil {
		return Update{}, err
	}
	d := &n.Data
	u := Update{Progress: -1}
	switch n.Type {
	case "content":
		u.Kind, u.Text = KindContent, d.Text
	case "toolCall":
		u.Kind, u.ToolName, u.ToolStatus = KindToolCall, d.ToolName, d.Status
	case "complete":
		u.Kind, u.Success, u.SessionID, u.Text, u.Progress = KindComplete, d.Success, d.SessionID, d.Summary, 100
	case "error":
		u.Kind, u.Text = KindError, strings.TrimSpace(d.Message+" "+d.Details)
	case "progress":
		u.Kind, u.Text = KindProgress, d.Text
		if d.Progress != nil {
			u.Progress = min(max(*d.Progress, 0), 100)
		}
	case "":
		return Update{}, errors.New("type is missing")
	default:
		u.Kind = KindOther
	}
	return u, nil
}

// legacyLine is seed 002's pre-JSON-RPC format.
type legacyLine struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

type legacyData struct {
	Percentage *float64 `json:"percentage"`
	Progress   *float64 `json:"progress"`
	Message    string   `json:"message"`
	Level      string   `json:"level"`
	Status     string   `json:"status"`
	Result     string   `json:"result"`
	Summary    string   `json:"summary"`
	Error      string   `json:"error"`
}

// handleLegacy takes a seed 002 legacy line (progress, log, result, error,
// status, heartbeat) as an update.
func (c *Client) handleLegacy(line []byte) {
	var l legacyLine
	if err := json.Unmarshal(line, &l); err != nil {
		c.opts.OnDrop(DropNotJSON)
		return
	}
	var d legacyData
	if len(l.Data) > 0 && l.Data[0] == '{' {
		_ = json.Unmarshal(l.Data, &d) // fields of the wrong type stay empty
	}
	u := Update{Progress: -1, Raw: line}
	switch l.Type {
	case "progress":
		u.Kind = KindProgress
		for _, p := range []*float64{d.Percentage, d.Progress} {
			if p != nil {
				u.Progress = min(max(int(*p), 0), 100)
				break
			}
		}
		u.Text = d.Message
	case "log":
		u.Kind, u.Text = KindLog, d.Message
	case "status":
		u.Kind, u.Text = KindStatus, d.Status
	case "heartbeat":
		u.Kind = KindHeartbeat
	case "error":
		u.Kind = KindError
		u.Text = firstNonEmpty(d.Message, d.Error)
	case "result":
		// result: completed, failed or cancelled.
		status := firstNonEmpty(d.Status, d.Result)
		u.Kind, u.Text, u.Success = KindComplete, firstNonEmpty(d.Summary, d.Message, status), status == "" || status == "completed"
		if status == "cancelled" {
			c.opts.OnUpdate(context.Background(), u)
			c.endTurn(Turn{StopReason: StopCancelled})
			return
		}
		u.Progress = 100
	default:
		c.log.Warn("acp: dropping a legacy line of unknown type", "type", l.Type)
		c.opts.OnDrop(DropUnknownType)
		return
	}
	c.opts.OnUpdate(context.Background(), u)
	switch u.Kind {
	case KindComplete:
		if u.Success {
			c.endTurn(Turn{StopReason: StopEndTurn, Message: u.Text})
		} else {
			c.endTurn(Turn{StopReason: StopError, Message: u.Text})
		}
	case KindError:
		c.endTurn(Turn{StopReason: StopError, Message: u.Text})
	}
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// handlePermission answers session/request_permission by the type's
// policy: allow picks an allow_once option (else allow_always), allow_always
// the reverse, deny a reject option; a cancelled turn, or no option the
// policy can pick, is the cancelled outcome.
func (c *Client) handlePermission(_ context.Context, req *jsonrpc.Request) (any, error) {
	var p sdk.RequestPermissionRequest
	if err := req.DecodeParams(&p); err != nil {
		return nil, err
	}
	c.mu.Lock()
	cancelled := c.cancelled
	c.mu.Unlock()
	cancel := sdk.RequestPermissionResponse{Outcome: sdk.RequestPermissionOutcome{Cancelled: &sdk.RequestPermissionOutcomeCancelled{Outcome: "cancelled"}}}
	if cancelled {
		return cancel, nil
	}
	var prefer []sdk.PermissionOptionKind
	switch c.opts.Permission {
	case "allow":
		prefer = []sdk.PermissionOptionKind{sdk.PermissionOptionKindAllowOnce, sdk.PermissionOptionKindAllowAlways}
	case "allow_always":
		prefer = []sdk.PermissionOptionKind{sdk.PermissionOptionKindAllowAlways, sdk.PermissionOptionKindAllowOnce}
	default:
		prefer = []sdk.PermissionOptionKind{sdk.PermissionOptionKindRejectOnce, sdk.PermissionOptionKindRejectAlways}
	}
	for _, kind := range prefer {
		for _, o := range p.Options {
			if o.Kind == kind {
				return sdk.RequestPermissionResponse{Outcome: sdk.RequestPermissionOutcome{
					Selected: &sdk.RequestPermissionOutcomeSelected{OptionId: o.OptionId, Outcome: "selected"}}}, nil
			}
		}
	}
	return cancel, nil
}

// MaxFileBytes bounds what fs/read_text_file returns and fs/write_text_file
// writes.
const MaxFileBytes = 8 << 20

func (c *Client) handleReadFile(_ context.Context, req *jsonrpc.Request) (any, error) {
	var p sdk.ReadTextFileRequest
	if err := req.DecodeParams(&p); err != nil {
		return nil, err
	}
	path, err := Confine(c.opts.Workspace, p.Path)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: err.Error()}
	}
	info, err := os.Stat(path)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: "fs/read_text_file: " + err.Error()}
	}
	if info.Size() > MaxFileBytes {
		return nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: fmt.Sprintf("fs/read_text_file: %s is %d bytes, over the %d byte limit", p.Path, info.Size(), MaxFileBytes)}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InternalError, Message: "fs/read_text_file: " + err.Error()}
	}
	content := string(data)
	if p.Line != nil || p.Limit != nil {
		lines := strings.SplitAfter(content, "\n")
		start := 0
		if p.Line != nil {
			start = min(max(*p.Line-1, 0), len(lines))
		}
		end := len(lines)
		if p.Limit != nil {
			end = min(start+max(*p.Limit, 0), len(lines))
		}
		content = strings.Join(lines[start:end], "")
	}
	return sdk.ReadTextFileResponse{Content: content}, nil
}

func (c *Client) handleWriteFile(_ context.Context, req *jsonrpc.Request) (any, error) {
	var p sdk.WriteTextFileRequest
	if err := req.DecodeParams(&p); err != nil {
		return nil, err
	}
	if len(p.Content) > MaxFileBytes {
		return nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: fmt.Sprintf("fs/write_text_file: content is %d bytes, over the %d byte limit", len(p.Content), MaxFileBytes)}
	}
	path, err := Confine(c.opts.Workspace, p.Path)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: err.Error()}
	}
	if err := os.WriteFile(path, []byte(p.Content), 0o644); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InternalError, Message: "fs/write_text_file: " + err.Error()}
	}
	return sdk.WriteTextFileResponse{}, nil
}

// ErrOutsideRoot is wrapped by Confine's refusals.
var ErrOutsideRoot = errors.New("path is outside the allowed directory")

// Confine resolves path, which must be absolute, and returns it if it lies
// within root once symbolic links are followed: the path itself when it
// exists, otherwise its parent directory (a file about to be written). An
// empty root confines everything out.
func Confine(root, path string) (string, error) {
	if root == "" {
		return "", fmt.Errorf("%s: %w: no workspace", path, ErrOutsideRoot)
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q: the path must be absolute", path)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("workspace %s: %w", root, err)
	}
	clean := filepath.Clean(path)
	resolved, err := filepath.EvalSymlinks(clean)
	if errors.Is(err, os.ErrNotExist) {
		if info, lerr := os.Lstat(clean); lerr == nil && info.Mode()&os.ModeSymlink != 0 {
			// A dangling link: writing through it would create its target,
			// wherever that is.
			return "", fmt.Errorf("%s: %w: a symbolic link to a missing file", path, ErrOutsideRoot)
		}
		var dir string
		dir, err = filepath.EvalSymlinks(filepath.Dir(clean))
		resolved = filepath.Join(dir, filepath.Base(clean))
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if !Within(realRoot, resolved) {
		return "", fmt.Errorf("%s: %w %s", path, ErrOutsideRoot, root)
	}
	return resolved, nil
}

// Within reports whether path is root or below it; both must be clean.
func Within(root, path string) bool {
	if root == path || root == "/" {
		return true
	}
	return strings.HasPrefix(path, root+string(filepath.Separator))
}
