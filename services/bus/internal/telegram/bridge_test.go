package telegram_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/internal/telegram"
	"github.com/conclave-ai/conclave/services/bus/service"
)

const botToken = "123456:test-token"

// fakeBotAPI speaks the Bot API's JSON on a local port: one update from
// alice, then empty long polls; sendMessage calls are recorded.
type fakeBotAPI struct {
	mu   sync.Mutex
	sent chan map[string]string
	gave bool
}

func (f *fakeBotAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseMultipartForm(1 << 20); err != nil && err != http.ErrNotMultipart {
		http.Error(w, err.Error(), 400)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch strings.TrimPrefix(r.URL.Path, "/bot"+botToken+"/") {
	case "getUpdates":
		f.mu.Lock()
		first := !f.gave
		f.gave = true
		f.mu.Unlock()
		if first {
			io.WriteString(w, `{"ok":true,"result":[{"update_id":1,"message":{"message_id":7,"from":{"id":42,"is_bot":false,"username":"alice"},"chat":{"id":123456789,"type":"private"},"date":1739788200,"text":"Hello, what can you do?"}}]}`)
			return
		}
		select {
		case <-r.Context().Done():
		case <-time.After(time.Second):
		}
		io.WriteString(w, `{"ok":true,"result":[]}`)
	case "sendMessage":
		f.sent <- map[string]string{"chat_id": r.FormValue("chat_id"), "text": r.FormValue("text")}
		io.WriteString(w, `{"ok":true,"result":{"message_id":8,"date":1739788300,"chat":{"id":123456789,"type":"private"},"text":"ok"}}`)
	default:
		w.WriteHeader(404)
		io.WriteString(w, `{"ok":false,"error_code":404,"description":"Not Found"}`)
	}
}

func TestBridge(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus and a Bot API server")
	}
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busURL := startBus(t, ctx)
	api := &fakeBotAPI{sent: make(chan map[string]string, 1)}
	srv := httptest.NewServer(api)
	defer srv.Close()

	// An agent for the chat, and the bridge.
	got := make(chan map[string]any, 1)
	agent := dialBus(t, ctx, busURL, jsonrpc.Methods{"processMessage": func(_ context.Context, req *jsonrpc.Request) (any, error) {
		var p map[string]any
		_ = json.Unmarshal(req.Params, &p)
		got <- p
		return map[string]any{"processed": true}, nil
	}})
	call(t, ctx, agent, "initialize", `{"clientId":"agent-tg","capabilities":{"processMessage":true}}`)
	call(t, ctx, agent, "subscribe", `{"topic":"tg:*"}`)
	done := make(chan error, 1)
	go func() {
		done <- telegram.Run(ctx, telegram.Config{BotToken: botToken, APIURL: srv.URL, BusURL: busURL, ClientID: "tg-bridge"},
			slog.New(slog.DiscardHandler))
	}()

	p := <-got
	payload := testenv.At[map[string]any](t, p, "payload")
	if p["topic"] != "tg:123456789" || payload["type"] != "telegram_message" || payload["text"] != "Hello, what can you do?" ||
		payload["from"] != "alice" || payload["chat_id"] != "123456789" || payload["message_id"] != "7" {
		t.Errorf("published %v", p)
	}

	// The agent's reply on outbound:{chat_id} goes to the chat. The bridge
	// subscribed before it started polling, so it is there by now.
	var res struct {
		Acks []struct {
			Processed bool `json:"processed"`
		} `json:"acks"`
	}
	if err := agent.Call(ctx, "sendMessage", json.RawMessage(`{"topic":"outbound:123456789","payload":{"type":"plaintext_message","text":"I can help."}}`), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Acks) != 1 || !res.Acks[0].Processed {
		t.Errorf("the bridge did not process the reply: %+v", res)
	}
	sent := <-api.sent
	if sent["chat_id"] != "123456789" || sent["text"] != "I can help." {
		t.Errorf("sendMessage to Telegram %v", sent)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("bridge ended with %v", err)
	}
}

func startBus(t *testing.T, ctx context.Context) string {
	t.Helper()
	var cfg struct{ Bus service.Config }
	if err := config.Load(ctx, &cfg, "bus", nil, func(k string) (string, bool) {
		switch k {
		case "CONCLAVE_BUS_ALLOW_UNAUTHENTICATED":
			return "true", true
		case "CONCLAVE_BUS_ADDR":
			return "127.0.0.1:0", true // an open bus binds loopback only
		}
		return "", false
	}, io.Discard); err != nil {
		t.Fatal(err)
	}
	cfg.Bus.Addr = "127.0.0.1:0"
	dir := t.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	if err := queue.EnsureAll(ctx, q, service.Queues(service.Config{})...); err != nil {
		t.Fatal(err)
	}
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "bus-test"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := service.New(cfg.Bus, service.Deps{Store: st, Queue: q, Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = b.Run(runCtx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	<-b.Ready()
	return "ws://" + b.Endpoints()[0].Address
}

func dialBus(t *testing.T, ctx context.Context, url string, h jsonrpc.Handler) *jsonrpc.Conn {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), h)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func call(t *testing.T, ctx context.Context, c *jsonrpc.Conn, method, params string) {
	t.Helper()
	if err := c.Call(ctx, method, json.RawMessage(params), nil); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
}
