package jsonrpc_test

import (
	"context"
	"fmt"
	"net"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// Two ends of a stdio-like pipe, each able to call the other: the agent
// side asks for permission while the client's prompt is still in flight.
func Example() {
	clientEnd, agentEnd := net.Pipe()

	agent := jsonrpc.NewConn(jsonrpc.NewLineStream(agentEnd, agentEnd, 0), jsonrpc.Methods{
		"session/prompt": func(ctx context.Context, req *jsonrpc.Request) (any, error) {
			client, _ := jsonrpc.ConnFromContext(ctx)
			var allowed bool
			if err := client.Call(ctx, "session/request_permission", map[string]string{"tool": "shell"}, &allowed); err != nil {
				return nil, err
			}
			if !allowed {
				return nil, jsonrpc.NewError(-32001, "permission denied")
			}
			return map[string]string{"stopReason": "end_turn"}, nil
		},
	})
	defer agent.Close()

	client := jsonrpc.NewConn(jsonrpc.NewLineStream(clientEnd, clientEnd, 0), jsonrpc.Methods{
		"session/request_permission": func(context.Context, *jsonrpc.Request) (any, error) {
			return true, nil
		},
	})
	defer client.Close()

	var result struct{ StopReason string }
	if err := client.Call(context.Background(), "session/prompt", map[string]string{"text": "hi"}, &result); err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println(result.StopReason)
	// Output: end_turn
}
