package web

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// chatEvent is one step of an agent's reply as the page shows it. Text is
// only ever put into the page as text (textContent), never as markup.
type chatEvent struct {
	Kind    string `json:"kind"` // thinking, text, tool_use, tool_result, tool_state, file, usage, session, done, error, cancelled, failed, end
	Text    string `json:"text,omitempty"`
	Name    string `json:"name,omitempty"`
	IsError bool   `json:"is_error,omitempty"`
}

// maxChatEvents bounds what one chat keeps; a longer reply is cut with a
// note (the agent's full text still ends up in done's full_response).
const maxChatEvents = 20000

// chat is one message sent to an agent and its streamed reply, kept so
// that the page (and a reconnecting EventSource) can read it from any
// point.
type chat struct {
	ID        string
	Owner     string // the session id: only its owner may read or cancel it
	AgentID   string
	Content   string
	TraceID   string
	Started   time.Time
	cancelRun context.CancelFunc

	mu        sync.Mutex
	requestID string
	events    []chatEvent
	done      bool
	truncated bool
	changed   chan struct{} // closed and replaced on every change
}

func (c *chat) add(ev chatEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	if len(c.events) >= maxChatEvents {
		if !c.truncated {
			c.truncated = true
			c.events = append(c.events, chatEvent{Kind: "error", Text: fmt.Sprintf("the reply is longer than %d events; the rest is not shown", maxChatEvents)})
			c.notify()
		}
		return
	}
	c.events = append(c.events, ev)
	c.notify()
}

func (c *chat) setRequestID(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.requestID == "" {
		c.requestID = id
	}
}

// ThreadID is the gateway's thread of the chat, which the gateway's
// history keeps.
func (c *chat) ThreadID() string { return "console-" + c.ID }

// RequestID is the gateway's id of the request, once known.
func (c *chat) RequestID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requestID
}

// finish ends the chat with a last event.
func (c *chat) finish(last chatEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.events = append(c.events, last)
	c.done = true
	c.notify()
}

func (c *chat) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// since returns the events from index i, whether the chat is over, and a
// channel closed at its next change.
func (c *chat) since(i int) ([]chatEvent, bool, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i > len(c.events) {
		i = len(c.events)
	}
	return append([]chatEvent(nil), c.events[i:]...), c.done, c.changed
}

// Snapshot is the chat's events so far, for the transcript page.
func (c *chat) Snapshot() ([]chatEvent, bool) {
	evs, done, _ := c.since(0)
	return evs, done
}

// chatStore keeps the latest chats in memory.
type chatStore struct {
	mu    sync.Mutex
	max   int
	chats []*chat
}

func newChatStore(max int) *chatStore {
	if max <= 0 {
		max = 200
	}
	return &chatStore{max: max}
}

var errTooManyChats = errors.New("too many chats are running; wait for one to end")

// add keeps c, dropping the oldest finished chat when full.
func (s *chatStore) add(c *chat) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.chats) >= s.max {
		dropped := false
		for i, old := range s.chats {
			if _, done := old.Snapshot(); done {
				s.chats = append(s.chats[:i], s.chats[i+1:]...)
				dropped = true
				break
			}
		}
		if !dropped {
			return errTooManyChats
		}
	}
	s.chats = append(s.chats, c)
	return nil
}

func (s *chatStore) get(id, owner string) (*chat, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.chats {
		if c.ID == id && c.Owner == owner {
			return c, true
		}
	}
	return nil, false
}

func newChatID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// eventOf turns one of the agent's events into what the page shows.
func eventOf(m *gatewayv1.SendMessageResponse) chatEvent {
	ev := m.GetEvent()
	switch e := ev.GetEvent().(type) {
	case *covenpb.MessageResponse_Thinking:
		return chatEvent{Kind: "thinking", Text: e.Thinking}
	case *covenpb.MessageResponse_Text:
		return chatEvent{Kind: "text", Text: e.Text}
	case *covenpb.MessageResponse_ToolUse:
		return chatEvent{Kind: "tool_use", Name: e.ToolUse.GetName(), Text: e.ToolUse.GetInputJson()}
	case *covenpb.MessageResponse_ToolResult:
		return chatEvent{Kind: "tool_result", Text: e.ToolResult.GetOutput(), IsError: e.ToolResult.GetIsError()}
	case *covenpb.MessageResponse_ToolState:
		text := strings.ToLower(strings.TrimPrefix(e.ToolState.GetState().String(), "TOOL_STATE_"))
		if d := e.ToolState.GetDetail(); d != "" {
			text += ": " + d
		}
		return chatEvent{Kind: "tool_state", Name: e.ToolState.GetId(), Text: text}
	case *covenpb.MessageResponse_File:
		return chatEvent{Kind: "file", Name: e.File.GetFilename(), Text: fmt.Sprintf("%s, %d bytes", e.File.GetMimeType(), len(e.File.GetData()))}
	case *covenpb.MessageResponse_Usage:
		return chatEvent{Kind: "usage", Text: usageText(e.Usage)}
	case *covenpb.MessageResponse_SessionInit:
		return chatEvent{Kind: "session", Text: e.SessionInit.GetSessionId()}
	case *covenpb.MessageResponse_Done:
		return chatEvent{Kind: "done", Text: e.Done.GetFullResponse()}
	case *covenpb.MessageResponse_Error:
		return chatEvent{Kind: "error", Text: e.Error}
	case *covenpb.MessageResponse_Cancelled:
		return chatEvent{Kind: "cancelled", Text: e.Cancelled.GetReason()}
	default:
		return chatEvent{Kind: "unknown", Text: "an event the console does not know"}
	}
}

func usageText(u *covenpb.TokenUsage) string {
	return fmt.Sprintf("%d input tokens, %d output tokens", u.GetInputTokens(), u.GetOutputTokens())
}
