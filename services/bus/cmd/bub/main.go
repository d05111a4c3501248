// Command bub is the bus's command line: send-message, subscribe, dlq and
// serve, one JSON object per line of output.
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
	if err := service.CLI(ctx, "bub", os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, config.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bub:", err)
		os.Exit(1)
	}
}
