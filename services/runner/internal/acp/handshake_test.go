package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// TestHandshakeFailure: a JSON-RPC error the agent answers with is the
// agent's error, with its message (it was labelled a dead protocol); an
// agent that offers authMethods says which when the type names none; only
// no answer at all is a dead protocol.
func TestHandshakeFailure(t *testing.T) {
	t.Parallel()
	offers := []AuthMethod{{ID: "gemini-api-key", Name: "Gemini API key"}, {ID: "oauth-personal", Name: "Log in with Google"}}
	keyMissing := &jsonrpc.Error{Code: -32000, Message: "Gemini API key is missing or not configured."}
	for _, tt := range []struct {
		name, method string
		err          error
		offers       []AuthMethod
		authMethod   string
		outcome      string
		reason       string
	}{
		{"no answer", "initialize", fmt.Errorf("initialize: %w", context.DeadlineExceeded), nil, "", OutcomeDeadProtocol,
			"dead protocol: no answer to initialize within 30s"},
		{"an agent error", "session/new", fmt.Errorf("session/new: %w", keyMissing), nil, "", OutcomeAgentError,
			"session/new: the agent answered with an error: Gemini API key is missing or not configured. (code -32000)"},
		{"an agent error with data", "session/load", fmt.Errorf("session/load: %w", &jsonrpc.Error{Code: -32603, Message: "Internal error", Data: json.RawMessage(`{"details":"Invalid session identifier"}`)}), nil, "", OutcomeAgentError,
			`session/load: the agent answered with an error: Internal error (code -32603): {"details":"Invalid session identifier"}`},
		{"an agent error, and auth methods offered", "session/new", fmt.Errorf("session/new: %w", keyMissing), offers, "", OutcomeAgentError,
			"session/new: the agent answered with an error: Gemini API key is missing or not configured. (code -32000); the agent offers authMethods gemini-api-key (Gemini API key), oauth-personal (Log in with Google), and the agent type names none in auth_method"},
		{"an agent error after authenticating", "session/new", fmt.Errorf("session/new: %w", keyMissing), offers, "gemini-api-key", OutcomeAgentError,
			"session/new: the agent answered with an error: Gemini API key is missing or not configured. (code -32000)"},
		{"an auth method not offered", "authenticate", fmt.Errorf("authenticate: %w: %q", ErrAuthMethod, "api-key"), offers, "api-key", OutcomeBadType,
			`the agent type's auth_method "api-key" is not one the agent offers; it offers gemini-api-key (Gemini API key), oauth-personal (Log in with Google)`},
		{"the agent gone", "session/new", fmt.Errorf("session/new: %w: %w", ErrAgentGone, jsonrpc.ErrClosed), nil, "", OutcomeExited,
			"the agent exited before it answered session/new"},
		{"a malformed answer", "session/new", fmt.Errorf("session/new: the agent returned no sessionId"), nil, "", OutcomeProtocolError,
			"session/new: the agent returned no sessionId"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := New(strings.NewReader(""), nopWriteCloser{io.Discard}, Options{AuthMethod: tt.authMethod})
			t.Cleanup(func() { _ = c.Close() })
			c.capabilities.AuthMethods = tt.offers
			outcome, reason := c.HandshakeFailure(tt.method, tt.err, 30*time.Second)
			if outcome != tt.outcome || reason != tt.reason {
				t.Fatalf("got %s, %q\nwant %s, %q", outcome, reason, tt.outcome, tt.reason)
			}
		})
	}
}
