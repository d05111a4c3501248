// Package telegram is the Telegram bridge: a bus peer like any other. It
// long-polls the Telegram Bot API, publishes each message as a
// telegram_message on tg:{chat_id}, subscribes to outbound:* and sends what
// arrives there to the chat named by the topic.
package telegram

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/go-telegram/bot"
	"github.com/go-telegram/bot/models"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// Config is the bridge's configuration.
type Config struct {
	BotToken string `env:"CONCLAVE_TELEGRAM_BOT_TOKEN" help:"the bot's token from @BotFather"`
	APIURL   string `env:"CONCLAVE_TELEGRAM_API_URL" default:"https://api.telegram.org" help:"the Bot API's base URL"`
	BusURL   string `env:"BUB_BUS_URL" default:"ws://127.0.0.1:7892" help:"the bus"`
	BusToken string `env:"BUB_TOKEN" help:"the bridge's bearer token on the bus"`
	ClientID string `env:"CONCLAVE_TELEGRAM_CLIENT_ID" default:"tg-bridge" help:"the bridge's clientId on the bus"`
}

// Validate implements config.Validator.
func (c Config) Validate() error {
	if c.BotToken == "" {
		return errors.New("CONCLAVE_TELEGRAM_BOT_TOKEN: the bridge needs the bot's token")
	}
	return nil
}

// Message is the telegram_message payload of the bub protocol's type table.
type Message struct {
	Type      string `json:"type"`
	Text      string `json:"text"`
	From      string `json:"from"`
	ChatID    string `json:"chat_id"`
	Timestamp string `json:"timestamp"`
	MessageID string `json:"message_id"`
}

// Bridge connects one bot to the bus.
type Bridge struct {
	cfg  Config
	log  *slog.Logger
	conn *jsonrpc.Conn
	bot  *bot.Bot
}

// Run connects to the bus and to the Bot API and bridges them until ctx
// ends or the bus connection does.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	br := &Bridge{cfg: cfg, log: logger}
	header := http.Header{}
	if cfg.BusToken != "" {
		header.Set("Authorization", "Bearer "+cfg.BusToken)
	}
	ws, _, err := websocket.Dial(ctx, cfg.BusURL, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		return fmt.Errorf("connecting to the bus at %s: %w", cfg.BusURL, err)
	}
	deliver := jsonrpc.HandlerFunc(br.deliver)
	br.conn = jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), jsonrpc.Methods{"sendMessage": deliver, "processMessage": deliver})
	defer br.conn.Close()
	if err := br.conn.Call(ctx, "initialize", map[string]any{"clientId": cfg.ClientID,
		"clientInfo": map[string]string{"name": "conclave-telegram-bridge", "version": "0.1.0"}}, nil); err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	br.bot, err = bot.New(cfg.BotToken, bot.WithServerURL(cfg.APIURL), bot.WithSkipGetMe(),
		bot.WithDefaultHandler(br.inbound),
		bot.WithErrorsHandler(func(err error) { logger.Warn("telegram: Bot API error", "error", err) }))
	if err != nil {
		return fmt.Errorf("telegram: %w", err)
	}
	if err := br.conn.Call(ctx, "subscribe", map[string]string{"topic": "outbound:*"}, nil); err != nil {
		return fmt.Errorf("subscribe outbound:*: %w", err)
	}
	botCtx, stop := context.WithCancel(ctx)
	defer stop()
	go br.bot.Start(botCtx)
	select {
	case <-ctx.Done():
		return nil
	case <-br.conn.Done():
		return fmt.Errorf("the bus closed the connection: %w", br.conn.Err())
	}
}

// inbound publishes a Telegram message on tg:{chat_id}.
func (br *Bridge) inbound(ctx context.Context, _ *bot.Bot, u *models.Update) {
	m := u.Message
	if m == nil || m.Text == "" {
		return
	}
	from := ""
	if m.From != nil {
		from = m.From.Username
		if from == "" {
			from = strconv.FormatInt(m.From.ID, 10)
		}
	}
	chatID := strconv.FormatInt(m.Chat.ID, 10)
	payload := Message{Type: "telegram_message", Text: m.Text, From: from, ChatID: chatID,
		Timestamp: time.Unix(int64(m.Date), 0).UTC().Format(time.RFC3339), MessageID: strconv.Itoa(m.ID)}
	var res json.RawMessage
	if err := br.conn.Call(ctx, "sendMessage", map[string]any{"topic": "tg:" + chatID, "payload": payload}, &res); err != nil {
		br.log.WarnContext(ctx, "telegram: publishing a message failed", "chat_id", chatID, "error", err)
	}
}

// deliver sends a message on outbound:{chat_id} to the chat.
func (br *Bridge) deliver(ctx context.Context, req *jsonrpc.Request) (any, error) {
	var msg struct {
		Topic   string `json:"topic"`
		Payload struct {
			Text   string `json:"text"`
			ChatID string `json:"chat_id"`
		} `json:"payload"`
	}
	if err := req.DecodeParams(&msg); err != nil {
		return nil, err
	}
	chatID := strings.TrimPrefix(msg.Topic, "outbound:")
	if msg.Payload.ChatID != "" {
		chatID = msg.Payload.ChatID
	}
	id, err := strconv.ParseInt(chatID, 10, 64)
	if err != nil || msg.Payload.Text == "" {
		return map[string]any{"success": false, "processed": false,
			"message": "want a numeric chat id (outbound:{chat_id}) and a payload with text"}, nil
	}
	if _, err := br.bot.SendMessage(ctx, &bot.SendMessageParams{ChatID: id, Text: msg.Payload.Text}); err != nil {
		return map[string]any{"success": false, "processed": false, "should_retry": true, "retry_seconds": 5,
			"message": "Telegram refused: " + err.Error()}, nil
	}
	return map[string]any{"success": true, "processed": true, "message": "sent to Telegram"}, nil
}
