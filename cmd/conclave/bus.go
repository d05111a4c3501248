package main

import (
	"context"
	"io"
	"os"

	bus "github.com/conclave-ai/conclave/services/bus/service"
)

// runBus is `conclave bus ...`: the bub command line.
func runBus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return bus.CLI(ctx, "conclave bus", args, os.LookupEnv, os.Stdin, stdout, stderr)
}
