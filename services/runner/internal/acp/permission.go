package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	sdk "github.com/coder/acp-go-sdk"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// notingPermission wraps the session/request_permission handler so that
// each request, and then how it was answered, reaches OnUpdate as a
// KindPermissionRequest and a KindPermissionOutcome update: the log and the
// task's topic say what the agent asked to do and what it was told,
// whatever decided the answer.
func (c *Client) notingPermission(handle func(context.Context, *jsonrpc.Request) (any, error)) func(context.Context, *jsonrpc.Request) (any, error) {
	return func(ctx context.Context, req *jsonrpc.Request) (any, error) {
		var p sdk.RequestPermissionRequest
		if err := req.DecodeParams(&p); err != nil {
			// Answered InvalidParams by the handler, which decodes it too.
			return handle(ctx, req)
		}
		call := p.ToolCall
		asked := Update{Kind: KindPermissionRequest, Progress: -1, ToolCallID: string(call.ToolCallId), Raw: req.Params}
		if call.Title != nil {
			asked.ToolName = *call.Title
		}
		options := make([]string, 0, len(p.Options))
		for _, o := range p.Options {
			options = append(options, fmt.Sprintf("%s [%s]", o.OptionId, o.Kind))
		}
		asked.Text = summary("options " + strings.Join(options, ", "))
		c.opts.OnUpdate(ctx, asked)

		res, err := handle(ctx, req)

		answered := Update{Kind: KindPermissionOutcome, Progress: -1, ToolCallID: asked.ToolCallID, ToolName: asked.ToolName}
		// Read as the agent will, from the JSON, whatever type the
		// handler answered with.
		var r struct {
			Outcome struct {
				Outcome  string                 `json:"outcome"`
				OptionID sdk.PermissionOptionId `json:"optionId"`
			} `json:"outcome"`
		}
		noted := map[string]any{"sessionId": p.SessionId, "toolCallId": call.ToolCallId}
		if err != nil {
			answered.ToolStatus, answered.Text = "error", summary(err.Error())
			noted["error"] = err.Error()
		} else if data, merr := json.Marshal(res); merr == nil && json.Unmarshal(data, &r) == nil {
			answered.ToolStatus, answered.Text = r.Outcome.Outcome, r.Outcome.Outcome
			if r.Outcome.OptionID != "" {
				answered.Text += " " + string(r.Outcome.OptionID)
				for _, o := range p.Options {
					if o.OptionId == r.Outcome.OptionID {
						answered.Text += " [" + string(o.Kind) + "]"
					}
				}
			}
			noted["response"] = json.RawMessage(data)
		}
		if c.opts.Permission != "" {
			answered.Text += " (policy " + c.opts.Permission + ")"
		}
		answered.Raw, _ = json.Marshal(noted)
		c.opts.OnUpdate(ctx, answered)
		return res, err
	}
}
