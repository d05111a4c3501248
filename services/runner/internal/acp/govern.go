package acp

import (
	"context"
	"encoding/json"

	sdk "github.com/coder/acp-go-sdk"
)

// PermissionLibrarian is the policy under which Options.Govern decides
// each permission request (agenttype.PermissionLibrarian).
const PermissionLibrarian = "librarian"

// MetaKey names what the runner adds to a governed permission's outcome
// under _meta, ACP's room for extensions: the Librarian's decision, its
// constraints and the reason for a refusal.
const MetaKey = "conclave.ai/librarian"

// PermissionRequest is an agent's session/request_permission, for Govern.
type PermissionRequest struct {
	// Params are the request's params as the agent sent them (agent-host
	// forwards them to the runner as they are).
	Params   json.RawMessage
	ToolCall sdk.ToolCallUpdate
	Options  []sdk.PermissionOption
}

// PermissionAnswer is Govern's decision on a permission request.
type PermissionAnswer struct {
	Allow bool
	// Meta is sent to the agent in the outcome's _meta, under MetaKey.
	Meta map[string]any
}

// governed answers a permission request by Govern's decision: its
// allow-once option when allowed (never allow_always, which would let the
// agent skip the next question), else its reject option; the cancelled
// outcome when the turn was cancelled meanwhile, as ACP requires of every
// pending request.
func (c *Client) governed(ctx context.Context, params json.RawMessage, p sdk.RequestPermissionRequest) sdk.RequestPermissionResponse {
	cancelledOutcome := sdk.RequestPermissionResponse{Outcome: sdk.RequestPermissionOutcome{Cancelled: &sdk.RequestPermissionOutcomeCancelled{Outcome: "cancelled"}}}
	c.mu.Lock()
	turnCancelled := c.turnCancelled
	c.mu.Unlock()
	answer := PermissionAnswer{Meta: map[string]any{"decision": "unavailable", "reason": "no Librarian is configured for this runner"}}
	if c.opts.Govern != nil {
		gctx, stop := context.WithCancel(ctx)
		defer stop()
		if turnCancelled != nil {
			go func() {
				select {
				case <-turnCancelled:
					stop()
				case <-gctx.Done():
				}
			}()
		}
		answer = c.opts.Govern(gctx, PermissionRequest{Params: params, ToolCall: p.ToolCall, Options: p.Options})
	}
	c.mu.Lock()
	cancelled := c.cancelled
	c.mu.Unlock()
	if cancelled {
		return cancelledOutcome
	}
	prefer := []sdk.PermissionOptionKind{sdk.PermissionOptionKindRejectOnce, sdk.PermissionOptionKindRejectAlways}
	if answer.Allow {
		prefer = []sdk.PermissionOptionKind{sdk.PermissionOptionKindAllowOnce}
	}
	var meta map[string]any
	if answer.Meta != nil {
		meta = map[string]any{MetaKey: answer.Meta}
	}
	for _, kind := range prefer {
		for _, o := range p.Options {
			if o.Kind == kind {
				return sdk.RequestPermissionResponse{Meta: meta, Outcome: sdk.RequestPermissionOutcome{
					Selected: &sdk.RequestPermissionOutcomeSelected{Meta: meta, OptionId: o.OptionId, Outcome: "selected"}}}
			}
		}
	}
	// No option says what was decided: an approval without allow-once, or
	// a refusal without a reject option. Neither lets the agent go on.
	cancelledOutcome.Meta = meta
	return cancelledOutcome
}
