package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/coder/websocket"
)

// TestConcurrentFanOut: many publishes at once to many continueAll
// subscribers, whose requests are queued and written together: every
// subscriber gets every message once, and every publisher result carries
// every subscriber's ack.
func TestConcurrentFanOut(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	const subscribers, messages = 20, 16
	bus := startBus(t, defaultConfig(t, nil), busOption{})
	var wg sync.WaitGroup
	for i := range subscribers {
		sub := bus.client(t, fmt.Sprintf("sub-%d", i), "")
		sub.subscribe(2, "fan:*", "continueAll")
		wg.Go(func() {
			seen := map[float64]bool{}
			for range messages {
				_, data, err := sub.c.Read(context.Background())
				if err != nil {
					t.Errorf("subscriber %d: %v", i, err)
					return
				}
				var req struct {
					ID     json.RawMessage
					Method string
					Params struct{ Payload struct{ N float64 } }
				}
				if err := json.Unmarshal(data, &req); err != nil || req.Method != "sendMessage" {
					t.Errorf("subscriber %d got %s (%v)", i, data, err)
					return
				}
				if seen[req.Params.Payload.N] {
					t.Errorf("subscriber %d got message %v twice", i, req.Params.Payload.N)
				}
				seen[req.Params.Payload.N] = true
				answer := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"success":true}}`, req.ID)
				if err := sub.c.Write(context.Background(), websocket.MessageText, []byte(answer)); err != nil {
					t.Errorf("subscriber %d: %v", i, err)
					return
				}
			}
		})
	}
	pub := bus.client(t, "pub", "")
	for n := range messages {
		pub.publish(100+n, "fan:1", fmt.Sprintf(`{"n":%d}`, n))
	}
	for range messages {
		res := pub.recv()
		result, _ := res["result"].(map[string]any)
		acks, _ := result["acks"].([]any)
		if len(acks) != subscribers {
			t.Errorf("result %v: %d acks, want %d", res, len(acks), subscribers)
		}
	}
	wg.Wait()
}
