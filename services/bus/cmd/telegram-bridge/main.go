// Command telegram-bridge connects a Telegram bot to the bus: messages to
// the bot are published on tg:{chat_id}, and messages on outbound:{chat_id}
// are sent to that chat.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bus/internal/telegram"
)

type appConfig struct {
	config.Common
	Telegram telegram.Config
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, config.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "telegram-bridge:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "telegram-bridge", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	return telegram.Run(ctx, cfg.Telegram, cfg.Logger(os.Stderr, "telegram-bridge"))
}
