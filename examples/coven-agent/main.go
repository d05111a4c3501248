// Command coven-agent is a small coven agent to run against a Conclave
// gateway: it registers, answers every message with a scripted reply that
// uses each kind of event, and reconnects whenever the stream ends.
//
//	go run ./examples/coven-agent --addr localhost:50051 --name demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/conclave-ai/conclave/examples/coven-agent/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "coven-agent:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	cfg.Logger = logger
	logger.InfoContext(ctx, "coven agent starting", "agent_id", cfg.AgentID, "name", cfg.Name, "gateway", cfg.Addr)
	if err := agent.Run(ctx, cfg); err != nil {
		return err
	}
	logger.Info("coven agent stopped")
	return nil
}
