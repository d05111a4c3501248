// Package mcpserver exposes the tool agents as MCP tools with the official Go
// SDK: one tool per configured agent plus health_check. The SDK negotiates
// the protocol version with each client.
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/services/bridge/internal/agentconfig"
	"github.com/conclave-ai/conclave/services/bridge/internal/tools"
)

// Options tune the server.
type Options struct {
	// Version is reported to clients in serverInfo.
	Version string
	// ProgressInterval is how often a running call sends a progress
	// notification, when the client asked for them with a progress token.
	ProgressInterval time.Duration
	Logger           *slog.Logger
	// Calls, when it ends, cancels every running tool call. A call's own
	// context ends only with its session or when the client cancels it,
	// so this is how a stopping server takes its agents down. Nil means
	// never.
	Calls context.Context
}

// New returns an MCP server with r's tools.
func New(r *tools.Runner, opts Options) *mcp.Server {
	if opts.ProgressInterval <= 0 {
		opts.ProgressInterval = 5 * time.Second
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "conclave-bridge", Title: "Conclave tool bridge", Version: opts.Version},
		&mcp.ServerOptions{
			Logger: opts.Logger,
			Instructions: "Each tool runs a configured agent with the hybrid protocol and returns its JSON response " +
				"({\"status\":\"success\",\"data\":...} or an error). health_check reports whether every agent can run.",
		})
	for _, a := range r.Config().Agents {
		s.AddTool(&mcp.Tool{
			Name:        a.Name,
			Description: a.Description,
			InputSchema: a.InputSchema,
		}, callHandler(r, a, opts.ProgressInterval, opts.Calls))
	}
	s.AddTool(&mcp.Tool{
		Name:        agentconfig.HealthCheckTool,
		Description: "Reports, for every agent, whether its script and interpreter exist and are usable.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		h := r.Health()
		status := hybrid.StatusSuccess
		if !h.Healthy {
			status = hybrid.StatusError
		}
		body := map[string]any{"status": status, "data": h}
		if !h.Healthy {
			body["error"] = "some agents cannot run; see data.agents"
		}
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b), IsError: !h.Healthy}, nil
	})
	return s
}

func callHandler(r *tools.Runner, a *agentconfig.Agent, interval time.Duration, calls context.Context) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if calls != nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(calls, cancel)()
		}
		if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
			stop := reportProgress(ctx, req.Session, token, a, interval)
			defer stop()
		}
		resp, err := r.Call(ctx, a.Name, req.Params.Arguments)
		if err != nil {
			var he *hybrid.Error
			if !errors.As(err, &he) {
				return nil, err
			}
			b := he.Response()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: b, IsError: true}, nil
		}
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: string(resp.Object)}},
			StructuredContent: resp.Object,
			IsError:           resp.Status == hybrid.StatusError,
		}, nil
	}
}

// reportProgress sends a progress notification every interval while a call
// runs: seconds elapsed out of the agent's timeout. Agents have no progress
// channel in the protocol, so this tells a client the call is alive, not
// how far it got.
func reportProgress(ctx context.Context, ss *mcp.ServerSession, token any, a *agentconfig.Agent, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				elapsed := time.Since(start)
				_ = ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token,
					Progress:      elapsed.Seconds(),
					Total:         a.Run.Timeout.Seconds(),
					Message:       fmt.Sprintf("%s running for %s (timeout %s)", a.Name, elapsed.Round(time.Second), a.Run.Timeout),
				})
			}
		}
	}()
	return func() { cancel(); <-done }
}
