// Command telegram-bridge connects a Telegram bot to the bus: messages to
// the bot are published on tg:{chat_id}, and messages on outbound:{chat_id}
// are sent to that chat.
package main

import (
	"context"
	"os"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bus/internal/telegram"
)

type appConfig struct {
	config.Common
	Telegram telegram.Config
}

func main() { config.Main("telegram-bridge", run) }

func run(ctx context.Context, args []string) error {
	var cfg appConfig
	if err := config.Load(ctx, &cfg, "telegram-bridge", args, os.LookupEnv, os.Stderr); err != nil {
		return err
	}
	return telegram.Run(ctx, cfg.Telegram, cfg.Logger(os.Stderr, "telegram-bridge"))
}
