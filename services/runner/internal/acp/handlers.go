package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unicode/utf8"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/jsonscan"
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
	u.Raw, u.Replay = req.Params, c.replaying.Load()
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
// docs/runner-agents.md and bench_test.go).
func decodeACP(params []byte) (Update, error) {
	u := Update{Progress: -1}
	var (
		update []byte
		err    error
	)
	if err = jsonscan.EachMember(params, func(k, v []byte) bool {
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
		kind, content, entries, commands, title, mode, used, size []byte
	)
	if err = jsonscan.EachMember(update, func(k, v []byte) bool {
		switch string(k) {
		case "sessionUpdate":
			kind = v
		case "content":
			content = v
		case "toolCallId":
			u.ToolCallID = jsonscan.String(v)
		case "title":
			title = v
		case "status":
			u.ToolStatus = jsonscan.String(v)
		case "entries":
			entries = v
		case "availableCommands":
			commands = v
		case "currentModeId":
			mode = v
		case "used":
			used = v
		case "size":
			size = v
		}
		return true
	}); err != nil {
		return Update{}, err
	}
	name := jsonscan.String(kind)
	switch name {
	case "agent_message_chunk", "agent_thought_chunk", "user_message_chunk":
		switch name {
		case "agent_message_chunk":
			u.Kind = KindContent
		case "agent_thought_chunk":
			u.Kind = KindThought
		default:
			u.Kind = KindUserMessage
		}
		if u.Text, err = contentText(content); err != nil {
			return Update{}, err
		}
	case "tool_call", "tool_call_update":
		u.Kind = KindToolCall
		if name == "tool_call_update" {
			u.Kind = KindToolCallUpdate
		}
		u.ToolName = jsonscan.String(title)
	case "plan":
		u.Kind = KindPlan
		if u.Text, u.Progress, err = planSummary(entries); err != nil {
			return Update{}, err
		}
	case "available_commands_update":
		u.Kind = KindAvailableCommands
		var names []string
		if len(commands) > 0 && commands[0] == '[' {
			if err := jsonscan.EachElem(commands, func(e []byte) {
				_ = jsonscan.EachMember(e, func(k, v []byte) bool {
					if string(k) == "name" {
						names = append(names, jsonscan.String(v))
						return false
					}
					return true
				})
			}); err != nil {
				return Update{}, err
			}
		}
		u.Text = summary(strings.Join(names, ", "))
	case "current_mode_update":
		u.Kind, u.Text = KindCurrentMode, summary(jsonscan.String(mode))
	case "config_option_update":
		u.Kind = KindConfigOption
	case "session_info_update":
		u.Kind, u.Text = KindSessionInfo, summary(jsonscan.String(title))
	case "usage_update":
		u.Kind = KindUsage
		if len(used) > 0 && len(size) > 0 {
			u.Text = string(used) + " of " + string(size) + " tokens"
		}
	case "":
		return Update{}, errors.New("update.sessionUpdate is missing")
	default:
		// Named, so that the log says what the agent sent.
		u.Kind, u.Text = KindOther, summary(name)
	}
	return u, nil
}

// contentText is the text of a content block, if it is one with text.
func contentText(content []byte) (string, error) {
	if len(content) == 0 || content[0] != '{' {
		return "", nil
	}
	text := ""
	err := jsonscan.EachMember(content, func(k, v []byte) bool {
		if string(k) == "text" {
			text = jsonscan.String(v)
			return false
		}
		return true
	})
	return text, err
}

// planSummary is a plan's entries as one line ("2/3 completed: read the
// prompt [completed]; ..."), and its progress: the share of entries
// completed, or -1 for an empty plan.
func planSummary(entries []byte) (text string, progress int, err error) {
	if len(entries) == 0 || entries[0] != '[' {
		return "", -1, nil
	}
	total, done := 0, 0
	var items []string
	err = jsonscan.EachElem(entries, func(e []byte) {
		total++
		var content, status string
		_ = jsonscan.EachMember(e, func(k, v []byte) bool {
			switch string(k) {
			case "content":
				content = jsonscan.String(v)
			case "status":
				status = jsonscan.String(v)
			}
			return true
		})
		if status == "completed" {
			done++
		}
		items = append(items, content+" ["+status+"]")
	})
	if err != nil || total == 0 {
		return "", -1, err
	}
	return summary(fmt.Sprintf("%d/%d completed: %s", done, total, strings.Join(items, "; "))), done * 100 / total, nil
}

// maxSummary bounds the text the runner makes of an update: a log line
// and an event's text say what came, the event's raw update holds all of
// it.
const maxSummary = 512

// summary is s cut to maxSummary bytes, on a rune boundary.
func summary(s string) string {
	if len(s) <= maxSummary {
		return s
	}
	cut := maxSummary
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
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

// legacyLine is Kandev's pre-JSON-RPC format.
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

// handleLegacy takes a Kandev legacy line (progress, log, result, error,
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
func (c *Client) handlePermission(ctx context.Context, req *jsonrpc.Request) (any, error) {
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
	if c.opts.Permission == PermissionLibrarian {
		return c.governed(ctx, req.Params, p), nil
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

func (c *Client) handleReadFile(_ context.Context, req *jsonrpc.Request) (any, error) {
	const method = "fs/read_text_file"
	var p sdk.ReadTextFileRequest
	if err := req.DecodeParams(&p); err != nil {
		return nil, err
	}
	f, info, err := openInWorkspace(method, c.opts.Workspace, p.Path, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The content goes back on one line, which the agent reads with a
	// line limit of its own; ours is the nearest bound we know of.
	limit := int64(c.opts.MaxLine)
	tooLarge := &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: fmt.Sprintf("%s: %s is over the %d byte limit of a response line", method, p.Path, limit)}
	if info.Size() > limit {
		return nil, tooLarge
	}
	// The file may grow after fstat: the read is bounded all the same.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InternalError, Message: fmt.Sprintf("%s: %s: %v", method, p.Path, err)}
	}
	if int64(len(data)) > limit {
		return nil, tooLarge
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

// handleWriteFile writes a file in the workspace. Its content came on one
// line from the agent, so the line limit bounds it.
func (c *Client) handleWriteFile(_ context.Context, req *jsonrpc.Request) (any, error) {
	const method = "fs/write_text_file"
	var p sdk.WriteTextFileRequest
	if err := req.DecodeParams(&p); err != nil {
		return nil, err
	}
	// No O_TRUNC: a file is emptied only once it is known to be a regular
	// one.
	f, _, err := openInWorkspace(method, c.opts.Workspace, p.Path, os.O_WRONLY|os.O_CREATE)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = io.WriteString(f, p.Content)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.InternalError, Message: fmt.Sprintf("%s: %s: %v", method, p.Path, err)}
	}
	return sdk.WriteTextFileResponse{}, nil
}

// ErrOutsideRoot is wrapped by workspaceRelative's refusals.
var ErrOutsideRoot = errors.New("path is outside the workspace")

// workspaceRelative turns an agent's absolute path into one relative to the
// workspace, as the workspace was given or with its symbolic links resolved
// (an agent may have resolved them itself). Whether the file it names, once
// links are followed, is inside is settled by os.Root when it is opened.
func workspaceRelative(workspace, path string) (string, error) {
	if workspace == "" {
		return "", fmt.Errorf("%s: %w: there is no workspace", path, ErrOutsideRoot)
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q: the path must be absolute", path)
	}
	clean := filepath.Clean(path)
	roots := []string{workspace}
	if real, err := filepath.EvalSymlinks(workspace); err == nil && real != workspace {
		roots = append(roots, real)
	}
	for _, root := range roots {
		if rel, err := filepath.Rel(root, clean); err == nil && filepath.IsLocal(rel) {
			return rel, nil
		}
	}
	return "", fmt.Errorf("%s: %w %s", path, ErrOutsideRoot, workspace)
}

// openInWorkspace opens path for an fs method through os.Root, which
// resolves every component, symbolic links included, inside the workspace:
// a component swapped for a link out of it while this runs does not lead
// out. O_NONBLOCK keeps the open from waiting on a FIFO's other end, and the
// opened file must be a regular one: a FIFO, socket or device would block or
// never end, a directory has no text. Refusals are InvalidParams errors
// naming the path and the reason.
func openInWorkspace(method, workspace, path string, flag int) (*os.File, os.FileInfo, error) {
	refuse := func(reason string) error {
		return &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: fmt.Sprintf("%s: %s: %s", method, path, reason)}
	}
	rel, err := workspaceRelative(workspace, path)
	if err != nil {
		return nil, nil, &jsonrpc.Error{Code: jsonrpc.InvalidParams, Message: method + ": " + err.Error()}
	}
	root, err := os.OpenRoot(workspace)
	if err != nil {
		return nil, nil, &jsonrpc.Error{Code: jsonrpc.InternalError, Message: fmt.Sprintf("%s: workspace %s: %v", method, workspace, err)}
	}
	defer root.Close()
	f, err := root.OpenFile(rel, flag|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0o644)
	switch {
	case errors.Is(err, syscall.ENXIO):
		// A FIFO opened for writing with no reader, or a socket.
		return nil, nil, refuse("not a regular file (a FIFO, socket or device)")
	case errors.Is(err, syscall.EISDIR):
		return nil, nil, refuse("not a regular file (a directory)")
	case err != nil:
		var pe *os.PathError
		if errors.As(err, &pe) {
			// os.Root's refusal of a link out reads "path escapes from
			// parent".
			return nil, nil, refuse(pe.Err.Error())
		}
		return nil, nil, refuse(err.Error())
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, &jsonrpc.Error{Code: jsonrpc.InternalError, Message: fmt.Sprintf("%s: %s: %v", method, path, err)}
	}
	if !info.Mode().IsRegular() {
		f.Close()
		return nil, nil, refuse("not a regular file (" + fileKind(info.Mode()) + ")")
	}
	return f, info, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.Type().String()
}

// Within reports whether path is root or below it; both must be clean.
func Within(root, path string) bool {
	if root == path || root == "/" {
		return true
	}
	return strings.HasPrefix(path, root+string(filepath.Separator))
}
