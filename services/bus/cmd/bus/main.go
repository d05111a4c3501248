// Command bus runs the WebSocket JSON-RPC agent bus (the bub protocol).
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bus/service"
)

func main() {
	config.Main("bus", func(ctx context.Context, args []string) error {
		return service.Serve(ctx, "bus", args, os.LookupEnv, os.Stderr)
	})
}
