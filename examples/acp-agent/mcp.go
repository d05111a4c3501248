package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpTool is the MCP tool a turn calls with -mcp-url: its server's
// streamable HTTP endpoint, its name and its arguments, as the operator's
// agent type gives them (never the prompt's).
type mcpTool struct {
	url, name string
	args      map[string]any
	// token is the server's bearer token ("": none), from
	// ACP_AGENT_MCP_TOKEN.
	token string
}

// call calls the tool once, over a session of its own, sending traceparent
// (when set) with every HTTP request, so that the server's spans join the
// turn's trace. It returns the text of the result.
func (t mcpTool) call(ctx context.Context, traceparent string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "conclave-acp-agent", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: t.url, MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headers{traceparent, t.token, http.DefaultTransport}}}, nil)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", t.url, err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: t.name, Arguments: t.args})
	if err != nil {
		return "", fmt.Errorf("tools/call %s: %w", t.name, err)
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	if res.IsError {
		return "", fmt.Errorf("tools/call %s: the tool failed: %s", t.name, strings.Join(text, " "))
	}
	return strings.Join(text, "\n"), nil
}

// parseArgs reads -mcp-args, a JSON object.
func parseArgs(s string) (map[string]any, error) {
	args := map[string]any{}
	if s == "" {
		return args, nil
	}
	if err := json.Unmarshal([]byte(s), &args); err != nil {
		return nil, fmt.Errorf("-mcp-args is not a JSON object: %w", err)
	}
	return args, nil
}

// headers adds a traceparent header and a bearer token to each request,
// those of them that are set.
type headers struct {
	traceparent, token string
	next               http.RoundTripper
}

func (h headers) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if h.traceparent != "" {
		req.Header.Set("traceparent", h.traceparent)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	return h.next.RoundTrip(req)
}
