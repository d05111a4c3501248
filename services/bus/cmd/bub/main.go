// Command bub is the bus's command line: send-message, subscribe, dlq and
// serve, one JSON object per line of output.
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bus/service"
)

func main() {
	config.Main("bub", func(ctx context.Context, args []string) error {
		return service.CLI(ctx, "bub", args, os.LookupEnv, os.Stdin, os.Stdout, os.Stderr)
	})
}
