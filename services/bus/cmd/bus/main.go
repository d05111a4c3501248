// Command bus runs the WebSocket JSON-RPC agent bus (seed 004).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bus/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := service.Serve(ctx, "bus", os.Args[1:], os.LookupEnv, os.Stderr); err != nil {
		if errors.Is(err, config.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bus:", err)
		os.Exit(1)
	}
}
