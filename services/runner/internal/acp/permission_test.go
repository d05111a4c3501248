package acp

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// TestPermissionPolicies: each policy picks the option its kind prefers,
// falls back to its second choice, and answers cancelled when neither is
// offered or the turn was cancelled.
func TestPermissionPolicies(t *testing.T) {
	// Options as an agent sends them, on the wire.
	type option = map[string]string
	opt := func(id, kind string) option { return option{"optionId": id, "kind": kind, "name": id} }
	all := []option{opt("once", "allow_once"), opt("always", "allow_always"), opt("reject", "reject_once"), opt("reject-always", "reject_always")}
	allowsOnly := []option{all[0], all[1]}
	rejectsOnly := []option{all[2], all[3]}
	const cancelled = ""
	for _, tt := range []struct {
		name, policy string
		options      []option
		cancelled    bool
		want         string // the option selected, or cancelled
	}{
		{"allow picks allow_once", "allow", all, false, "once"},
		{"allow falls back to allow_always", "allow", all[1:], false, "always"},
		{"allow with only rejects", "allow", rejectsOnly, false, cancelled},
		{"allow_always picks allow_always", "allow_always", all, false, "always"},
		{"allow_always falls back to allow_once", "allow_always", []option{all[0], all[2]}, false, "once"},
		{"allow_always with only rejects", "allow_always", rejectsOnly, false, cancelled},
		{"deny picks reject_once", "deny", all, false, "reject"},
		{"deny falls back to reject_always", "deny", []option{all[0], all[1], all[3]}, false, "reject-always"},
		{"deny with only allows", "deny", allowsOnly, false, cancelled},
		{"the default is deny", "", all, false, "reject"},
		{"no options", "allow", nil, false, cancelled},
		{"allow, turn cancelled", "allow", all, true, cancelled},
		{"allow_always, turn cancelled", "allow_always", all, true, cancelled},
		{"deny, turn cancelled", "deny", all, true, cancelled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := New(strings.NewReader(""), nopWriteCloser{io.Discard}, Options{Permission: tt.policy})
			t.Cleanup(func() { _ = c.Close() })
			if tt.cancelled {
				c.mu.Lock()
				c.cancelled = true
				c.mu.Unlock()
			}
			params, err := json.Marshal(map[string]any{
				"sessionId": "s", "options": tt.options,
				"toolCall": map[string]any{"toolCallId": "call-1", "title": "write a file", "status": "pending"},
			})
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.handlePermission(context.Background(), &jsonrpc.Request{ID: jsonrpc.Int64ID(1), Method: "session/request_permission", Params: params})
			if err != nil {
				t.Fatal(err)
			}
			// As the agent reads it: the JSON on the wire.
			raw, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Outcome struct {
					Outcome  string `json:"outcome"`
					OptionID string `json:"optionId"`
				} `json:"outcome"`
			}
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			switch {
			case tt.want == cancelled:
				if got.Outcome.Outcome != "cancelled" || got.Outcome.OptionID != "" {
					t.Fatalf("got %s, want the cancelled outcome", raw)
				}
			case got.Outcome.Outcome != "selected" || got.Outcome.OptionID != tt.want:
				t.Fatalf("got %s, want option %q selected", raw, tt.want)
			}
		})
	}
}

// TestGovernedPermission: under the librarian policy Govern decides; an
// approval selects allow_once only, a refusal a reject option, with the
// decision in _meta; no Govern refuses; a turn cancelled during the wait
// answers cancelled.
func TestGovernedPermission(t *testing.T) {
	type option = map[string]string
	opt := func(id, kind string) option { return option{"optionId": id, "kind": kind, "name": id} }
	all := []option{opt("once", "allow_once"), opt("always", "allow_always"), opt("reject", "reject_once")}
	allow := func(context.Context, PermissionRequest) PermissionAnswer {
		return PermissionAnswer{Allow: true, Meta: map[string]any{"decision": "approved", "constraints": []string{"stay in the workspace"}}}
	}
	refuse := func(context.Context, PermissionRequest) PermissionAnswer {
		return PermissionAnswer{Meta: map[string]any{"decision": "rejected", "reason": "a deviation"}}
	}
	for _, tt := range []struct {
		name     string
		govern   func(context.Context, PermissionRequest) PermissionAnswer
		options  []option
		cancel   bool
		want     string // option selected, or "" for the cancelled outcome
		decision string // _meta's decision
	}{
		{"approved", allow, all, false, "once", "approved"},
		{"approved, but no allow_once", allow, []option{all[1], all[2]}, false, "", "approved"},
		{"rejected", refuse, all, false, "reject", "rejected"},
		{"no Librarian", nil, all, false, "reject", "unavailable"},
		{"cancelled while waiting", func(ctx context.Context, _ PermissionRequest) PermissionAnswer {
			<-ctx.Done()
			return PermissionAnswer{Meta: map[string]any{"decision": "cancelled"}}
		}, all, true, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var seen PermissionRequest
			govern := tt.govern
			var c *Client
			if govern != nil {
				govern = func(ctx context.Context, p PermissionRequest) PermissionAnswer {
					seen = p
					if tt.cancel {
						// The turn is cancelled while Govern waits (not
						// before it is asked, which answers cancelled
						// without asking).
						c.mu.Lock()
						close(c.turnCancelled)
						c.cancelled = true
						c.mu.Unlock()
					}
					return tt.govern(ctx, p)
				}
			}
			c = New(strings.NewReader(""), nopWriteCloser{io.Discard}, Options{Permission: "librarian", Govern: govern})
			t.Cleanup(func() { _ = c.Close() })
			c.mu.Lock()
			c.turnCancelled = make(chan struct{})
			c.mu.Unlock()
			params, _ := json.Marshal(map[string]any{"sessionId": "s", "options": tt.options,
				"toolCall": map[string]any{"toolCallId": "call-2", "title": "edit config", "kind": "edit", "locations": []map[string]any{{"path": "/w/config.json"}}}})
			res, err := c.handlePermission(context.Background(), &jsonrpc.Request{ID: jsonrpc.Int64ID(1), Method: "session/request_permission", Params: params})
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := json.Marshal(res)
			var got struct {
				Meta    map[string]map[string]any `json:"_meta"`
				Outcome struct {
					Outcome  string `json:"outcome"`
					OptionID string `json:"optionId"`
				} `json:"outcome"`
			}
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if tt.want == "" && got.Outcome.Outcome != "cancelled" || tt.want != "" && got.Outcome.OptionID != tt.want {
				t.Fatalf("got %s, want %q", raw, tt.want)
			}
			if tt.decision != "" && got.Meta[MetaKey]["decision"] != tt.decision {
				t.Fatalf("_meta %s", raw)
			}
			if govern != nil && (seen.ToolCall.ToolCallId != "call-2" || len(seen.ToolCall.Locations) != 1 || len(seen.Params) == 0) {
				t.Fatalf("Govern saw %+v", seen)
			}
		})
	}
}

// TestPermissionNoted: a permission request, and the answer it got, reach
// OnUpdate as a permission_request and a permission_outcome update, with
// the tool call, the options and the option selected.
func TestPermissionNoted(t *testing.T) {
	for _, tt := range []struct {
		policy, outcome string
	}{
		{"allow", "selected once [allow_once] (policy allow)"},
		{"deny", "selected reject [reject_once] (policy deny)"},
	} {
		t.Run(tt.policy, func(t *testing.T) {
			var r recorder
			o := r.opts(DialectACP)
			o.Permission = tt.policy
			c := New(strings.NewReader(""), nopWriteCloser{io.Discard}, o)
			t.Cleanup(func() { _ = c.Close() })
			params := `{"sessionId":"s","toolCall":{"toolCallId":"call-1","title":"write a file","status":"pending"},` +
				`"options":[{"optionId":"once","name":"Allow","kind":"allow_once"},{"optionId":"reject","name":"Reject","kind":"reject_once"}]}`
			if _, err := c.notingPermission(c.handlePermission)(context.Background(), &jsonrpc.Request{ID: jsonrpc.Int64ID(1), Method: "session/request_permission", Params: json.RawMessage(params)}); err != nil {
				t.Fatal(err)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.updates) != 2 {
				t.Fatalf("updates %+v, want the request and its outcome", r.updates)
			}
			asked, answered := r.updates[0], r.updates[1]
			if asked.Kind != KindPermissionRequest || asked.ToolCallID != "call-1" || asked.ToolName != "write a file" ||
				asked.Text != "options once [allow_once], reject [reject_once]" || string(asked.Raw) != params {
				t.Errorf("request %+v", asked)
			}
			if answered.Kind != KindPermissionOutcome || answered.ToolCallID != "call-1" || answered.ToolStatus != "selected" || answered.Text != tt.outcome ||
				!strings.Contains(string(answered.Raw), `"toolCallId":"call-1"`) {
				t.Errorf("outcome %+v (%s)", answered, answered.Raw)
			}
		})
	}
}
