package service_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// TestBadInput sends what a broken or hostile client would, and checks
// each gets a protocol error or a close code with a reason while the bus
// goes on serving everyone else.
func TestBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()

	t.Run("invalid JSON and batches", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		w := bus.client(t, "batcher", "")
		w.send(`[`)
		if code, _ := errorOf(t, w.recv()); code != -32700 {
			t.Errorf("truncated batch: code %d, want -32700", code)
		}
		w.send(`[]`)
		if code, _ := errorOf(t, w.recv()); code != -32600 {
			t.Errorf("empty batch: code %d, want -32600", code)
		}
		w.send(`[1,"x",{}]`)
		var arr []map[string]any
		if err := jsonUnmarshal(w.recvRaw(), &arr); err != nil || len(arr) != 3 {
			t.Fatalf("batch of invalid elements: %v %v", arr, err)
		}
		for _, r := range arr {
			if code, _ := errorOf(t, r); code != -32600 {
				t.Errorf("invalid batch element: code %d", code)
			}
		}
		// A large batch is answered in full, bounded by the per-client
		// rate (the burst) rather than by the bus running out of anything.
		var b strings.Builder
		b.WriteString("[")
		for i := range 1000 {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","method":"ping","id":%d}`, i)
		}
		b.WriteString("]")
		w.send(b.String())
		arr = nil
		if err := jsonUnmarshal(w.recvRaw(), &arr); err != nil || len(arr) != 1000 {
			t.Fatalf("batch of 1000 pings: %d answers, %v", len(arr), err)
		}
		ok, limited := 0, 0
		for _, r := range arr {
			if _, isResult := r["result"]; isResult {
				ok++
			} else if code, _ := errorOf(t, r); code == broker.CodeRateLimited {
				limited++
			}
		}
		if ok == 0 || limited == 0 || ok+limited != 1000 {
			t.Errorf("batch of 1000 pings: %d answered, %d rate limited", ok, limited)
		}
		other := bus.client(t, "bystander", "")
		other.result(2, "ping", `{}`)
	})

	t.Run("frame over the size limit", func(t *testing.T) {
		t.Parallel()
		cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_MAX_FRAME_BYTES": "4096"})
		bus := startBus(t, cfg, busOption{})
		w := bus.client(t, "big", "")
		w.send(fmt.Sprintf(`{"jsonrpc":"2.0","method":"sendMessage","params":{"topic":"t:1","payload":{"text":%q}},"id":2}`, strings.Repeat("x", 8192)))
		_, _, err := w.c.Read(context.Background())
		if status := websocket.CloseStatus(err); status != websocket.StatusMessageTooBig {
			t.Errorf("after an oversized frame: %v (status %d), want close 1009", err, status)
		}
		bus.client(t, "bystander", "").result(2, "ping", `{}`)
	})

	t.Run("subscriber that never answers", func(t *testing.T) {
		t.Parallel()
		cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_DELIVERY_TIMEOUT": "200ms"})
		bus := startBus(t, cfg, busOption{})
		mute := bus.client(t, "mute", "")
		mute.subscribe(2, "mute:*", "")
		pub := bus.client(t, "pub", "")
		pub.publish(3, "mute:1", `{"text":"hello?"}`)
		id, _ := mute.expectRequest("sendMessage") // and never answered
		res := testenv.At[map[string]any](t, pub.response(3), "result")
		acks := testenv.At[[]any](t, res, "acks")
		if len(acks) != 1 {
			t.Fatalf("acks %v", acks)
		}
		ack := testenv.At[map[string]any](t, acks, 0)
		if ack["processed"] != false || !contains(testenv.At[string](t, ack, "message"), "delivery timeout") {
			t.Errorf("ack of a mute subscriber: %v", ack)
		}
		// The bus gave up on the delivery, and says so.
		cancel := mute.recv()
		if p, _ := cancel["params"].(map[string]any); cancel["method"] != "$/cancelRequest" || p["id"] != id {
			t.Errorf("after the delivery timeout the subscriber got %v, want $/cancelRequest of id %v", cancel, id)
		}
		// A late answer is dropped, and the publisher's connection serves on.
		mute.reply(id, `{"success":true}`)
		pub.result(4, "ping", `{}`)
	})

	t.Run("slow reader", func(t *testing.T) {
		t.Parallel()
		cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_OUTBOUND_BUFFER": "4", "CONCLAVE_BUS_WRITE_TIMEOUT": "1s"})
		bus := startBus(t, cfg, busOption{})
		slow := bus.client(t, "slow", "")
		slow.subscribe(2, "firehose:*", "continueAll")
		pub := bus.client(t, "firehose", "")
		big := fmt.Sprintf(`{"text":%q}`, strings.Repeat("y", 512<<10))
		const n = 64
		for i := range n {
			pub.publish(100+i, "firehose:1", big)
		}
		// The slow subscriber never reads; the bus drops it rather than
		// holding the publishers or the frames.
		dropped := 0
		for range n {
			acks := testenv.At[[]any](t, pub.recv(), "result", "acks")
			// Either the delivery failed as the subscriber was dropped,
			// or it came after, and there was nobody left to deliver to.
			if len(acks) == 0 || contains(fmt.Sprint(testenv.At[map[string]any](t, acks, 0)["message"]), "disconnected") {
				dropped++
			}
		}
		if dropped == 0 {
			t.Errorf("the slow subscriber was never dropped")
		}
		var err error
		for err == nil {
			_, _, err = slow.c.Read(context.Background())
		}
		if status := websocket.CloseStatus(err); status != websocket.StatusPolicyViolation && status != -1 {
			t.Errorf("slow reader closed with %v (status %d), want 1008 or a dropped connection", err, status)
		}
		pub.result(1000, "ping", `{}`)
	})

	t.Run("subscription flood", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_RATE": "100000", "CONCLAVE_BUS_BURST": "100000"}), busOption{})
		w := bus.client(t, "hoarder", "")
		var b strings.Builder
		b.WriteString("[")
		for i := range 10000 {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","method":"subscribe","params":{"topic":"flood:%d"},"id":%d}`, i, i)
		}
		b.WriteString("]")
		w.send(b.String())
		var arr []map[string]any
		if err := jsonUnmarshal(w.recvRaw(), &arr); err != nil || len(arr) != 10000 {
			t.Fatalf("10,000 subscribes: %d answers, %v", len(arr), err)
		}
		ok, refused := 0, 0
		for _, r := range arr {
			if _, isResult := r["result"]; isResult {
				ok++
			} else if code, _ := errorOf(t, r); code == broker.CodeTooManySubscriptions {
				refused++
			}
		}
		if ok != 100 || refused != 9900 {
			t.Errorf("10,000 subscribes: %d accepted, %d refused; want 100 and 9900", ok, refused)
		}
		bus.client(t, "bystander", "").result(2, "ping", `{}`)
	})

	t.Run("rate limit", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_RATE": "1", "CONCLAVE_BUS_BURST": "3"}), busOption{})
		w := bus.client(t, "chatty", "") // initialize used one token
		w.result(2, "ping", `{}`)
		w.result(3, "ping", `{}`)
		if code, msg := w.callError(4, "ping", `{}`); code != broker.CodeRateLimited {
			t.Errorf("past the burst: %d %s, want %d", code, msg, broker.CodeRateLimited)
		}
	})
}
