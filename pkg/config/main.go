package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Main is a deployable's whole main: it runs run with the command line's
// arguments and a context cancelled by SIGINT or SIGTERM, and exits 1 after
// printing its error, prefixed by name (0 after --help).
func Main(name string, run func(ctx context.Context, args []string) error) {
	os.Exit(mainCode(name, run, os.Args[1:], os.Stderr))
}

func mainCode(name string, run func(ctx context.Context, args []string) error, args []string, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, args)
	switch {
	case err == nil, errors.Is(err, ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}
