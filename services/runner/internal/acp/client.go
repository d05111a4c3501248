// Package acp is the runner's client for agents on stdio: Kandev's
// dialect and the Agent Client Protocol of agentclientprotocol.com, detected
// from initialize or fixed per agent type, plus Kandev's legacy line
// format. It is built on pkg/jsonrpc; the ACP dialect's requests use the
// types of github.com/coder/acp-go-sdk (see docs/runner-agents.md for why not its
// connection).
package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// Dialects.
const (
	DialectACP    = "acp"
	DialectKandev = "kandev"
	DialectLegacy = "legacy"
)

// Kinds of Update, the dialects' session/update types and legacy line
// types mapped onto one vocabulary.
const (
	KindContent        = "content"          // kandev content, acp agent_message_chunk
	KindThought        = "thought"          // acp agent_thought_chunk
	KindToolCall       = "tool_call"        // kandev toolCall, acp tool_call
	KindToolCallUpdate = "tool_call_update" // acp tool_call_update
	KindPlan           = "plan"             // acp plan
	// The ACP's other session updates, by their own names.
	KindUserMessage       = "user_message_chunk"        // the user's message, as a session/load replays it
	KindAvailableCommands = "available_commands_update" // the agent's slash commands
	KindCurrentMode       = "current_mode_update"       // the session's mode changed
	KindConfigOption      = "config_option_update"      // the session's configuration options changed
	KindSessionInfo       = "session_info_update"       // the session's title and the like
	KindUsage             = "usage_update"              // tokens and cost so far
	// KindPermissionRequest and KindPermissionOutcome are not updates the
	// agent sends: they report a session/request_permission and how the
	// runner answered it, so that both reach the log and the task's topic.
	KindPermissionRequest = "permission_request"
	KindPermissionOutcome = "permission_outcome"
	KindComplete          = "complete"  // kandev complete, legacy result
	KindError             = "error"     // kandev and legacy error
	KindProgress          = "progress"  // legacy progress
	KindLog               = "log"       // legacy log
	KindStatus            = "status"    // legacy status
	KindHeartbeat         = "heartbeat" // legacy heartbeat
	// KindOther is any other acp sessionUpdate; its Text is the name the
	// agent gave it.
	KindOther = "other"
)

// Update is one session/update or legacy line, normalized.
type Update struct {
	Kind string
	// Text is the content chunk, error message or log line.
	Text       string
	ToolCallID string
	ToolName   string
	ToolStatus string
	// Progress is 0-100, or -1 when the update says nothing of it.
	Progress int
	// Success is set by complete updates.
	Success bool
	// SessionID is set by kandev complete updates.
	SessionID string
	// Replay: the update replays the session's history during session/load.
	Replay bool
	// Raw is the update as the agent sent it: session/update params, or the
	// legacy line.
	Raw json.RawMessage
}

// Stop reasons a turn ends with (ACP's, which the other dialects map to).
const (
	StopEndTurn   = "end_turn"
	StopCancelled = "cancelled"
	StopError     = "error"
	StopRefusal   = "refusal"
)

// Turn is how a prompt turn ended.
type Turn struct {
	StopReason string
	// Message explains an error stop.
	Message string
}

// Options configure a Client.
type Options struct {
	// Dialect is DialectACP, DialectKandev, DialectLegacy, or "" to detect.
	Dialect string
	// Workspace confines fs/read_text_file and fs/write_text_file; empty
	// refuses both.
	Workspace string
	// Permission answers session/request_permission: allow, deny,
	// allow_always, or librarian (Govern decides).
	Permission string
	// Govern decides each permission request under the librarian policy
	// (nil refuses them all: fail closed). Its ctx ends when the turn is
	// cancelled or the connection ends; it may block for as long as a
	// person takes.
	Govern func(ctx context.Context, p PermissionRequest) PermissionAnswer
	// AuthMethod is the ACP authMethods id to authenticate with before
	// the session is opened, when the agent offers authMethods; empty:
	// none.
	AuthMethod string
	// MaxLine bounds a line from the agent (default 4 MiB); longer ones
	// are dropped.
	MaxLine int
	// OnUpdate receives every update, in the order the agent sent them.
	// It runs on the connection's read loop, so it must not block for long.
	OnUpdate func(ctx context.Context, u Update)
	// OnDrop is told of each line or message dropped, with a reason.
	OnDrop func(reason string)
	Logger *slog.Logger
}

// ErrAgentGone is wrapped by errors from a client whose agent closed stdout
// or exited.
var ErrAgentGone = errors.New("acp: the agent's connection ended")

// Client speaks to one agent process over its stdio.
type Client struct {
	opts Options
	conn *jsonrpc.Conn
	log  *slog.Logger

	dialect     atomic.Value // string
	initialized atomic.Bool

	mu        sync.Mutex
	sessionID string
	// turnDone ends a kandev turn when its complete or error update arrives.
	turnDone chan Turn
	// cancelled marks the turn in progress as cancelled, so that pending
	// permission requests are answered with the cancelled outcome;
	// turnCancelled is closed with it, ending the waits of governed ones.
	cancelled     bool
	turnCancelled chan struct{}
	capabilities  AgentCapabilities
	// turn is the turn begun and not yet ended, if any; turns numbers them.
	turn  *turnState
	turns uint64
	// replaying is set from session/load until the next prompt is
	// written: the updates the agent sends meanwhile are the session's
	// history, replayed (before the answer, as the ACP asks, or after it,
	// as some agents do).
	replaying atomic.Bool
	// heard is when the agent last wrote to its stdout (Unix nanoseconds).
	heard atomic.Int64
}

// heardReader notes when each read from the agent's stdout returns data.
type heardReader struct {
	r     io.Reader
	heard *atomic.Int64
}

func (h heardReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if n > 0 {
		h.heard.Store(time.Now().UnixNano())
	}
	return n, err
}

// LastHeard is when the agent last wrote anything to its stdout, or when
// the client was made if it has not yet.
func (c *Client) LastHeard() time.Time { return time.Unix(0, c.heard.Load()) }

// turnState orders a cancel after its turn's prompt: a cancel that comes
// before the prompt is written keeps the prompt from being sent at all,
// and one that comes while it is being written waits for the write, so the
// agent never sees session/cancel ahead of the prompt it cancels.
type turnState struct {
	id        uint64
	writing   bool
	cancelled bool
	// written is closed once the prompt has been written, or will not be.
	written chan struct{}
}

// AgentCapabilities is what initialize told us.
type AgentCapabilities struct {
	// LoadSession: the agent can resume a session (acp loadSession, kandev
	// sessionResumption).
	LoadSession bool
	AgentName   string
	// AuthMethods are the ACP authMethods the agent offers.
	AuthMethods []AuthMethod
}

// AuthMethod is one of the ways an ACP agent offers to authenticate.
type AuthMethod struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// OfferedAuth is the agent's authMethods as one line: "id (name), ...".
func (c AgentCapabilities) OfferedAuth() string {
	parts := make([]string, 0, len(c.AuthMethods))
	for _, m := range c.AuthMethods {
		if m.Name != "" && m.Name != m.ID {
			parts = append(parts, fmt.Sprintf("%s (%s)", m.ID, m.Name))
		} else {
			parts = append(parts, m.ID)
		}
	}
	return summary(strings.Join(parts, ", "))
}

// New starts a client on an agent's stdout (r) and stdin (w).
func New(r io.Reader, w io.WriteCloser, opts Options) *Client {
	if opts.MaxLine <= 0 {
		opts.MaxLine = jsonrpc.DefaultMaxFrameSize
	}
	if opts.OnUpdate == nil {
		opts.OnUpdate = func(context.Context, Update) {}
	}
	if opts.OnDrop == nil {
		opts.OnDrop = func(string) {}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{opts: opts, log: opts.Logger}
	c.dialect.Store(opts.Dialect)
	c.heard.Store(time.Now().UnixNano())
	r = heardReader{r: r, heard: &c.heard}
	drop := func(reason string, line []byte) {
		c.log.Warn("acp: dropping a line from the agent", "reason", reason, "bytes", len(line))
		opts.OnDrop(reason)
	}
	stream := newLineFilter(r, w, opts.MaxLine, c.handleLegacy, drop)
	c.conn = jsonrpc.NewConn(stream, jsonrpc.Methods{
		"session/update":             c.handleUpdate,
		"session/request_permission": c.notingPermission(c.handlePermission),
		"fs/read_text_file":          c.handleReadFile,
		"fs/write_text_file":         c.handleWriteFile,
	}, jsonrpc.WithCancelMethod("$/cancel_request", "requestId"), jsonrpc.WithLogger(opts.Logger))
	return c
}

// Dialect is the dialect in use: configured, detected, or "" before
// initialize.
func (c *Client) Dialect() string { return c.dialect.Load().(string) }

// SessionID is the agent's session, once created or loaded.
func (c *Client) SessionID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessionID
}

// Capabilities is what the agent said in initialize.
func (c *Client) Capabilities() AgentCapabilities {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capabilities
}

// Done is closed when the agent's connection ends.
func (c *Client) Done() <-chan struct{} { return c.conn.Done() }

// Close ends the connection, closing the agent's stdin.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) call(ctx context.Context, method string, params, result any) error {
	err := c.conn.Call(ctx, method, params, result)
	if errors.Is(err, jsonrpc.ErrClosed) {
		return fmt.Errorf("%s: %w: %w", method, ErrAgentGone, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// initializeParams is one initialize both dialects accept: ACP's integer
// protocolVersion and clientCapabilities, and Kandev's clientInfo and
// capabilities (a kandev agent reads only what it knows).
type initializeParams struct {
	ProtocolVersion    any               `json:"protocolVersion"`
	ClientInfo         map[string]string `json:"clientInfo"`
	ClientCapabilities map[string]any    `json:"clientCapabilities"`
	Capabilities       map[string]bool   `json:"capabilities,omitempty"`
}

type initializeResult struct {
	ProtocolVersion   json.RawMessage `json:"protocolVersion"`
	AgentCapabilities struct {
		LoadSession bool `json:"loadSession"`
	} `json:"agentCapabilities"`
	AuthMethods []AuthMethod           `json:"authMethods"`
	AgentInfo   *struct{ Name string } `json:"agentInfo"`
	ServerInfo  *struct{ Name string } `json:"serverInfo"`
	// Kandev's.
	Capabilities struct {
		SessionResumption bool `json:"sessionResumption"`
	} `json:"capabilities"`
}

// Initialize runs initialize and settles the dialect: a configured one, or
// the one the response's protocolVersion names (a number: ACP; a string:
// kandev). A legacy agent is not sent initialize at all.
func (c *Client) Initialize(ctx context.Context) error {
	if c.Dialect() == DialectLegacy {
		c.initialized.Store(true)
		return nil
	}
	params := initializeParams{
		ProtocolVersion: sdk.ProtocolVersionNumber,
		ClientInfo:      map[string]string{"name": "conclave-runner", "version": "1"},
		ClientCapabilities: map[string]any{
			"fs":       map[string]bool{"readTextFile": c.opts.Workspace != "", "writeTextFile": c.opts.Workspace != ""},
			"terminal": false,
		},
		Capabilities: map[string]bool{"streaming": true},
	}
	if c.Dialect() == DialectKandev {
		params.ProtocolVersion = "1.0"
	}
	// Updates may arrive as soon as the agent has answered.
	c.initialized.Store(true)
	var res initializeResult
	if err := c.call(ctx, "initialize", params, &res); err != nil {
		c.initialized.Store(false)
		return err
	}
	detected := ""
	switch v := string(res.ProtocolVersion); {
	case len(v) > 0 && v[0] == '"':
		detected = DialectKandev
	case len(v) > 0 && (v[0] >= '0' && v[0] <= '9'):
		detected = DialectACP
	default:
		return fmt.Errorf("initialize: the agent's protocolVersion %q is neither a number (acp) nor a string (kandev)", v)
	}
	if d := c.Dialect(); d != "" && d != detected {
		c.log.Warn("acp: the agent answered initialize in another dialect than its type's", "configured", d, "answered", detected)
	} else if d == "" {
		c.dialect.Store(detected)
	}
	name := ""
	if res.AgentInfo != nil {
		name = res.AgentInfo.Name
	} else if res.ServerInfo != nil {
		name = res.ServerInfo.Name
	}
	c.mu.Lock()
	c.capabilities = AgentCapabilities{LoadSession: res.AgentCapabilities.LoadSession || res.Capabilities.SessionResumption, AgentName: name,
		AuthMethods: res.AuthMethods}
	c.mu.Unlock()
	return nil
}

// ErrAuthMethod is wrapped by Authenticate's refusal of a method the agent
// does not offer.
var ErrAuthMethod = errors.New("the agent does not offer this auth method")

// Authenticate runs authenticate with Options.AuthMethod, when the agent
// offered authMethods in initialize and the option names one, and returns
// the method it authenticated with ("": it did not). A method the agent
// does not offer is refused, naming those it does, without asking the
// agent.
func (c *Client) Authenticate(ctx context.Context) (string, error) {
	caps, method := c.Capabilities(), c.opts.AuthMethod
	if method == "" || len(caps.AuthMethods) == 0 || c.Dialect() != DialectACP {
		return "", nil
	}
	if !slices.ContainsFunc(caps.AuthMethods, func(m AuthMethod) bool { return m.ID == method }) {
		return "", fmt.Errorf("authenticate: %w: %q; it offers %s", ErrAuthMethod, method, caps.OfferedAuth())
	}
	if err := c.call(ctx, "authenticate", sdk.AuthenticateRequest{MethodId: method}, nil); err != nil {
		return "", err
	}
	return method, nil
}

// NewSession runs session/new in cwd.
func (c *Client) NewSession(ctx context.Context, cwd string) (string, error) {
	if c.Dialect() == DialectLegacy {
		return "", nil
	}
	var params any = map[string]any{}
	if c.Dialect() == DialectACP {
		params = sdk.NewSessionRequest{Cwd: cwd, McpServers: []sdk.McpServer{}}
	}
	var res struct {
		SessionID string `json:"sessionId"`
	}
	if err := c.call(ctx, "session/new", params, &res); err != nil {
		return "", err
	}
	if res.SessionID == "" {
		return "", errors.New("session/new: the agent returned no sessionId")
	}
	c.mu.Lock()
	c.sessionID = res.SessionID
	c.mu.Unlock()
	return res.SessionID, nil
}

// Replay settling: after session/load has answered, the client waits for
// the agent to send nothing for replayQuiet (at most replaySettleMax in
// all) before it returns, so that a history replayed after the answer is
// over before the next prompt is written.
const (
	replayQuiet     = 250 * time.Millisecond
	replaySettleMax = 5 * time.Second
)

// LoadSession resumes sessionID with session/load. Every update the agent
// sends from now until the next prompt is written replays the session's
// history and reaches OnUpdate with Replay set: the ACP has the agent
// replay it before it answers, and some agents (Gemini CLI) answer first
// and stream the history after. So once the agent has answered, LoadSession
// waits for it to go quiet (replayQuiet, within replaySettleMax) before it
// returns, for the history to be over before the next prompt goes out.
func (c *Client) LoadSession(ctx context.Context, cwd, sessionID string) error {
	var params any = map[string]any{"sessionId": sessionID}
	if c.Dialect() == DialectACP {
		params = sdk.LoadSessionRequest{Cwd: cwd, SessionId: sdk.SessionId(sessionID), McpServers: []sdk.McpServer{}}
	}
	c.replaying.Store(true)
	if err := c.call(ctx, "session/load", params, nil); err != nil {
		c.replaying.Store(false)
		return err
	}
	c.mu.Lock()
	c.sessionID = sessionID
	c.mu.Unlock()
	c.settleReplay(ctx)
	return nil
}

// settleReplay waits until the agent has sent nothing for replayQuiet, for
// at most replaySettleMax, or until ctx ends or the agent goes.
func (c *Client) settleReplay(ctx context.Context) {
	deadline := time.Now().Add(replaySettleMax)
	timer := time.NewTimer(replayQuiet)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		case <-c.conn.Done():
			return
		}
		now := time.Now()
		quietFor := now.Sub(c.LastHeard())
		if quietFor >= replayQuiet || !now.Before(deadline) {
			return
		}
		timer.Reset(min(replayQuiet-quietFor, deadline.Sub(now)))
	}
}

// BeginTurn starts a turn without any I/O: from now on a Cancel applies to
// it, even before Prompt writes its prompt. Prompt begins the turn itself
// if BeginTurn was not called.
func (c *Client) BeginTurn() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.turn == nil {
		c.turns++
		c.turn = &turnState{id: c.turns, written: make(chan struct{})}
	}
	return c.turn.id
}

// AbandonTurn ends a turn begun with BeginTurn whose prompt will not be
// sent after all.
func (c *Client) AbandonTurn() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.turn; t != nil && !t.writing {
		c.turn = nil
		close(t.written)
	}
}

// Prompt runs one turn and returns how it ended. acceptTimeout bounds a
// kandev agent's immediate {accepted: true}: an agent that does not give it
// has a dead protocol. A legacy agent's turn is its whole run, ended by a
// result or error line. A turn cancelled before its prompt was written
// ends cancelled without the agent hearing of it.
func (c *Client) Prompt(ctx context.Context, message string, acceptTimeout time.Duration) (Turn, error) {
	c.BeginTurn()
	c.mu.Lock()
	t := c.turn
	if t.cancelled {
		c.turn = nil
		close(t.written)
		c.mu.Unlock()
		return Turn{StopReason: StopCancelled}, nil
	}
	t.writing, c.cancelled = true, false
	c.turnCancelled = make(chan struct{})
	sessionID := c.sessionID
	c.mu.Unlock()
	// What the agent sends from now on is the turn's.
	c.replaying.Store(false)
	writeDone := sync.OnceFunc(func() { close(t.written) })
	defer func() {
		writeDone()
		c.mu.Lock()
		if c.turn == t {
			c.turn = nil
		}
		c.mu.Unlock()
	}()
	switch c.Dialect() {
	case DialectACP:
		req := sdk.PromptRequest{SessionId: sdk.SessionId(sessionID), Prompt: []sdk.ContentBlock{sdk.TextBlock(message)}}
		var res struct {
			StopReason string `json:"stopReason"`
		}
		err := c.callWritten(ctx, "session/prompt", req, &res, writeDone)
		if err != nil {
			return Turn{StopReason: StopError, Message: err.Error()}, err
		}
		return Turn{StopReason: res.StopReason}, nil
	case DialectKandev, DialectLegacy:
		done := make(chan Turn, 1)
		c.mu.Lock()
		c.turnDone = done
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.turnDone = nil
			c.mu.Unlock()
		}()
		if c.Dialect() == DialectKandev {
			actx, cancel := context.WithTimeout(ctx, acceptTimeout)
			var res struct {
				Accepted bool `json:"accepted"`
			}
			err := c.callWritten(actx, "session/prompt", map[string]string{"message": message}, &res, writeDone)
			cancel()
			if err != nil {
				return Turn{StopReason: StopError, Message: err.Error()}, err
			}
			if !res.Accepted {
				return Turn{StopReason: StopRefusal, Message: "the agent did not accept the prompt"}, nil
			}
		}
		writeDone()
		select {
		case t := <-done:
			return t, nil
		case <-c.conn.Done():
			c.mu.Lock()
			cancelled := c.cancelled
			c.mu.Unlock()
			if cancelled {
				// Kandev's agents exit on session/cancel.
				return Turn{StopReason: StopCancelled}, nil
			}
			return Turn{StopReason: StopError, Message: "the agent exited mid-turn"}, fmt.Errorf("session/prompt: %w", ErrAgentGone)
		case <-ctx.Done():
			return Turn{StopReason: StopError, Message: ctx.Err().Error()}, ctx.Err()
		}
	}
	return Turn{}, errors.New("session/prompt: no dialect; call Initialize first")
}

// callWritten is call, telling written once the request is written.
func (c *Client) callWritten(ctx context.Context, method string, params, result any, written func()) error {
	p, err := c.conn.Start(ctx, method, params)
	written()
	if err == nil {
		err = p.Wait(ctx, result)
	}
	if errors.Is(err, jsonrpc.ErrClosed) {
		return fmt.Errorf("%s: %w: %w", method, ErrAgentGone, err)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return nil
}

// ErrCannotCancel: the agent's protocol has no way to cancel a turn.
var ErrCannotCancel = errors.New("session/cancel: this agent speaks no protocol that can cancel")

// Cancel asks the agent to end the turn in progress: session/cancel, a
// notification in both dialects, sent after the turn's prompt. The turn
// ends when the agent says so; the caller decides how long to wait. With
// no turn begun it does nothing. It may block while the prompt is being
// written (an agent that does not read its stdin), so callers that must
// not block call it on a goroutine of their own.
func (c *Client) Cancel(ctx context.Context, reason string) error {
	return c.CancelTurn(ctx, reason, 0)
}

// CancelTurn is Cancel for turn id (as BeginTurn returned it) only: a
// cancel that comes after its turn ended does not reach the next one. Id 0
// is whatever turn is in progress.
func (c *Client) CancelTurn(ctx context.Context, reason string, id uint64) error {
	c.mu.Lock()
	t := c.turn
	switch {
	case t == nil || id != 0 && t.id != id:
		c.mu.Unlock()
		return nil
	case !t.writing:
		t.cancelled = true
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if c.Dialect() == DialectLegacy {
		return ErrCannotCancel
	}
	select {
	case <-t.written:
	case <-c.conn.Done():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	if !c.cancelled && c.turnCancelled != nil {
		close(c.turnCancelled)
	}
	c.cancelled = true
	sessionID := c.sessionID
	c.mu.Unlock()
	if c.Dialect() == DialectACP {
		return c.conn.Notify(ctx, "session/cancel", sdk.CancelNotification{SessionId: sdk.SessionId(sessionID)})
	}
	return c.conn.Notify(ctx, "session/cancel", map[string]string{"reason": reason})
}

func (c *Client) endTurn(t Turn) {
	c.mu.Lock()
	done := c.turnDone
	c.mu.Unlock()
	if done != nil {
		select {
		case done <- t:
		default:
		}
	}
}
