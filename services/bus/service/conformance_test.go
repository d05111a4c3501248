package service_test

import (
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// TestBubConformance walks every example of the bub protocol's text, message by message,
// against the real bus over a real WebSocket, with frames written as the
// protocol's text writes them.
func TestBubConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, nil), busOption{})

	t.Run("initialize", func(t *testing.T) {
		t.Parallel()
		w := dial(t, bus.url, nil)
		w.send(`{
  "jsonrpc": "2.0",
  "method": "initialize",
  "params": {
    "clientId": "agent-1",
    "clientInfo": {
      "name": "bub",
      "version": "0.2.0"
    }
  },
  "id": 1
}`)
		m := w.recv()
		if m["id"] != float64(1) {
			t.Fatalf("id %v, want 1", m["id"])
		}
		res := testenv.At[map[string]any](t, m, "result")
		if res["serverId"] != "bus-1" {
			t.Errorf("serverId %v", res["serverId"])
		}
		info := testenv.At[map[string]any](t, res, "serverInfo")
		if info["name"] == "" || info["version"] == "" {
			t.Errorf("serverInfo %v", info)
		}
		caps := testenv.At[map[string]any](t, res, "capabilities")
		if caps["subscribe"] != true || caps["publish"] != true {
			t.Errorf("capabilities %v", caps)
		}
		topics := mustJSON(t, caps["topics"])
		for _, want := range []string{`"inbound:*"`, `"outbound:*"`, `"agent:*"`} {
			if !contains(topics, want) {
				t.Errorf("capabilities.topics %s lacks %s", topics, want)
			}
		}
		// Error -32001: already initialized.
		if code, _ := w.callError(2, "initialize", `{"clientId":"agent-1"}`); code != broker.CodeAlreadyInitialized {
			t.Errorf("second initialize: code %d, want -32001", code)
		}
	})

	t.Run("invalid client info", func(t *testing.T) {
		t.Parallel()
		for _, params := range []string{
			`{}`, `{"clientId":""}`, `{"clientId":42}`, `{"clientId":"a","clientInfo":"bub"}`,
			`{"clientId":"a","clientInfo":{"name":1}}`, `[1,2]`,
		} {
			w := dial(t, bus.url, nil)
			if code, msg := w.callError(1, "initialize", params); code != broker.CodeInvalidClientInfo {
				t.Errorf("initialize %s: code %d (%s), want -32002", params, code, msg)
			}
			// The failed initialize left the client uninitialized; a good
			// one still works.
			w.initialize("agent-ok", "")
		}
	})

	t.Run("requests before initialize", func(t *testing.T) {
		t.Parallel()
		w := dial(t, bus.url, nil)
		for i, method := range []string{"subscribe", "unsubscribe", "sendMessage", "ping"} {
			if code, msg := w.callError(i+1, method, `{"topic":"inbound:chat-1","payload":{}}`); code != broker.CodeNotInitialized {
				t.Errorf("%s before initialize: code %d (%s), want %d", method, code, msg, broker.CodeNotInitialized)
			}
		}
	})

	t.Run("subscribe and unsubscribe", func(t *testing.T) {
		t.Parallel()
		w := bus.client(t, "sub-1", "")
		w.send(`{
  "jsonrpc": "2.0",
  "method": "subscribe",
  "params": {
    "topic": "inbound:chat-*"
  },
  "id": 2
}`)
		if res := testenv.At[map[string]any](t, w.response(2), "result"); res["success"] != true {
			t.Fatalf("subscribe: %v", res)
		}
		if code, _ := w.callError(3, "subscribe", `{"topic":"inbound:chat-*"}`); code != broker.CodeAlreadySubscribed {
			t.Errorf("duplicate subscribe: code %d, want -32003", code)
		}
		if code, _ := w.callError(4, "subscribe", `{}`); code != -32602 {
			t.Errorf("subscribe without topic: code %d, want -32602", code)
		}
		if code, _ := w.callError(5, "subscribe", `{"topic":"inbound:*","policy":"whenever"}`); code != -32602 {
			t.Errorf("subscribe with an unknown policy: code %d, want -32602", code)
		}
		w.send(`{
  "jsonrpc": "2.0",
  "method": "unsubscribe",
  "params": {
    "topic": "inbound:chat-*"
  },
  "id": 3
}`)
		if res := testenv.At[map[string]any](t, w.response(3), "result"); res["success"] != true {
			t.Fatalf("unsubscribe: %v", res)
		}
		if code, _ := w.callError(6, "unsubscribe", `{"topic":"inbound:chat-*"}`); code != broker.CodeSubscriptionNotFound {
			t.Errorf("unsubscribe again: code %d, want -32004", code)
		}
		if code, _ := w.callError(7, "unsubscribe", `{}`); code != -32602 {
			t.Errorf("unsubscribe without topic: code %d, want -32602", code)
		}
	})

	t.Run("sendMessage fan-out", func(t *testing.T) {
		t.Parallel()
		// A bus of its own: "subscribe and unsubscribe", run beside it,
		// holds the same example pattern for a moment, and its subscriber
		// would get this message too.
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		sub := bus.client(t, "bridge-fanout", "")
		sub.subscribe(2, "inbound:chat-*", "")
		pub := bus.client(t, "publisher-fanout", "")
		pub.send(`{
  "jsonrpc": "2.0",
  "method": "sendMessage",
  "params": {
    "topic": "inbound:chat-1",
    "payload": {
      "chat_id": "chat-1",
      "text": "hello",
      "from": "user-1"
    }
  },
  "id": 4
}`)
		id, params := sub.expectRequest("sendMessage")
		if params["topic"] != "inbound:chat-1" {
			t.Errorf("delivered topic %v", params["topic"])
		}
		payload := testenv.At[map[string]any](t, params, "payload")
		if payload["chat_id"] != "chat-1" || payload["text"] != "hello" || payload["from"] != "user-1" {
			t.Errorf("delivered payload %v", payload)
		}
		sub.reply(id, `{"success": true, "stopPropagation": false}`)
		res := testenv.At[map[string]any](t, pub.response(4), "result")
		if res["success"] != true {
			t.Errorf("publisher's result %v", res)
		}
		acks := testenv.At[[]any](t, res, "acks")
		if len(acks) != 1 || testenv.At[map[string]any](t, acks, 0)["client_id"] != "bridge-fanout" || testenv.At[map[string]any](t, acks, 0)["processed"] != true {
			t.Errorf("acks %v", acks)
		}
	})

	t.Run("ping", func(t *testing.T) {
		t.Parallel()
		w := bus.client(t, "pinger", "")
		w.send(`{
  "jsonrpc": "2.0",
  "method": "ping",
  "params": {},
  "id": 100
}`)
		res := testenv.At[map[string]any](t, w.response(100), "result")
		if _, err := time.Parse(time.RFC3339, testenv.At[string](t, res, "timestamp")); err != nil {
			t.Errorf("timestamp %v: %v", res["timestamp"], err)
		}
	})

	t.Run("standard errors", func(t *testing.T) {
		t.Parallel()
		w := bus.client(t, "errors", "")
		w.send(`{"jsonrpc":"2.0","method":"ping",`)
		if code, _ := errorOf(t, w.recv()); code != -32700 {
			t.Errorf("invalid JSON: code %d, want -32700", code)
		}
		w.send(`{"jsonrpc":"1.0","method":"ping","id":1}`)
		if code, _ := errorOf(t, w.recv()); code != -32600 {
			t.Errorf("wrong version: code %d, want -32600", code)
		}
		if code, _ := w.callError(2, "publish", `{}`); code != -32601 {
			t.Errorf("unknown method: code %d, want -32601", code)
		}
		if code, _ := w.callError(3, "sendMessage", `{"topic":"x:1"}`); code != -32602 {
			t.Errorf("sendMessage without payload: code %d, want -32602", code)
		}
		if code, _ := w.callError(4, "sendMessage", `{"payload":{"text":"hi"}}`); code != -32602 {
			t.Errorf("sendMessage without topic or default topic: code %d, want -32602", code)
		}
		// The connection still serves after every error.
		w.result(5, "ping", `{}`)
	})

	t.Run("unrouted message", func(t *testing.T) {
		t.Parallel()
		w := bus.client(t, "lonely", "")
		res := w.result(2, "sendMessage", `{"topic":"nobody:listens","payload":{"text":"hi"}}`)
		if res["success"] != false || len(testenv.At[[]any](t, res, "acks")) != 0 {
			t.Errorf("unrouted: %v", res)
		}
	})

	t.Run("processMessage and acks", func(t *testing.T) {
		t.Parallel()
		agent := bus.client(t, "agent-other-agent-456", `,"capabilities":{"processMessage":true}`)
		agent.subscribe(2, "agent:other-agent-456", "")
		pub := bus.client(t, "agent-123", "")
		pub.send(`{
  "jsonrpc": "2.0",
  "method": "sendMessage",
  "params": {
    "topic": "agent:other-agent-456",
    "payload": {
      "type": "task_request",
      "task_id": "task-789",
      "description": "Analyze the log file",
      "priority": "high",
      "deadline": "2025-02-18T12:00:00Z"
    }
  },
  "id": 7
}`)
		id, params := agent.expectRequest("processMessage")
		if params["topic"] != "agent:other-agent-456" || testenv.At[map[string]any](t, params, "payload")["type"] != "task_request" {
			t.Errorf("processMessage params %v", params)
		}
		agent.reply(id, `{"processed": true, "should_retry": false, "retry_seconds": 0, "message": "Task accepted"}`)
		res := testenv.At[map[string]any](t, pub.response(7), "result")
		want := `{"acks":[{"client_id":"agent-other-agent-456","message":"Task accepted","processed":true}],"stopPropagation":false,"success":true}`
		if got := mustJSON(t, res); got != want {
			t.Errorf("result %s, want %s", got, want)
		}
	})

	t.Run("notification form", func(t *testing.T) {
		t.Parallel()
		// The protocol's notification form: no id, so no answer, whatever the
		// method. Every method of the protocol is a request; the bus ignores
		// one sent as a notification (a subscribe would give no sign of
		// its outcome, a sendMessage's acks nowhere to go).
		sub := bus.client(t, "notified-subscriber", "")
		sub.subscribe(2, "notify:*", "")
		w := bus.client(t, "notifier", "")
		w.send(`{
  "jsonrpc": "2.0",
  "method": "ping",
  "params": {}
}`)
		w.send(`{
  "jsonrpc": "2.0",
  "method": "sendMessage",
  "params": {
    "topic": "notify:1",
    "payload": {"chat_id": "chat-1", "text": "hello", "from": "user-1"}
  }
}`)
		w.send(`{"jsonrpc": "2.0", "method": "subscribe", "params": {"topic": "notify:mine"}}`)
		w.send(`{"jsonrpc": "2.0", "method": "method_name", "params": {}}`)
		// The next frame is the answer to this request: nothing answered
		// the notifications.
		if res := w.result(5, "ping", `{}`); res["timestamp"] == nil {
			t.Errorf("ping after the notifications: %v", res)
		}
		// The notified subscribe did not subscribe.
		if code, _ := w.callError(6, "unsubscribe", `{"topic":"notify:mine"}`); code != broker.CodeSubscriptionNotFound {
			t.Errorf("unsubscribe after a subscribe notification: %d, want -32004", code)
		}
		// The notified sendMessage reached no one: the subscriber's next
		// frame answers its own request.
		sub.result(3, "ping", `{}`)
	})

	t.Run("processMessage to an agent on tg:123456789", func(t *testing.T) {
		t.Parallel()
		// The protocol's processMessage example: a Telegram message published on
		// tg:123456789 reaches the agent subscribed there as processMessage,
		// and the agent's answer is the protocol's.
		agent := bus.client(t, "agent-abc123", `,"capabilities":{"processMessage":true}`)
		agent.subscribe(2, "tg:123456789", "")
		bridge := bus.client(t, "tg-bridge", "")
		bridge.send(`{
  "jsonrpc": "2.0",
  "method": "sendMessage",
  "params": {
    "topic": "tg:123456789",
    "payload": {
      "type": "telegram_message",
      "text": "Hello, what can you do?",
      "from": "user-1",
      "chat_id": "123456789",
      "timestamp": "2025-02-17T10:30:00Z"
    }
  },
  "id": 6
}`)
		m := agent.recv()
		if m["method"] != "processMessage" || m["id"] == nil {
			t.Fatalf("the agent got %v, want a processMessage request", m)
		}
		params := testenv.At[map[string]any](t, m, "params")
		if params["topic"] != "tg:123456789" {
			t.Errorf("processMessage topic %v", params["topic"])
		}
		want := `{"chat_id":"123456789","from":"user-1","text":"Hello, what can you do?","timestamp":"2025-02-17T10:30:00Z","type":"telegram_message"}`
		if got := mustJSON(t, params["payload"]); got != want {
			t.Errorf("processMessage payload %s, want %s", got, want)
		}
		agent.send(`{
  "jsonrpc": "2.0",
  "result": {
    "processed": true,
    "should_retry": false,
    "retry_seconds": 0,
    "message": "Message handled successfully"
  },
  "id": ` + mustJSON(t, m["id"]) + `
}`)
		res := testenv.At[map[string]any](t, bridge.response(6), "result")
		wantRes := `{"acks":[{"client_id":"agent-abc123","message":"Message handled successfully","processed":true}],"stopPropagation":false,"success":true}`
		if got := mustJSON(t, res); got != wantRes {
			t.Errorf("result %s, want %s", got, wantRes)
		}
	})

	t.Run("subscription with policy", func(t *testing.T) {
		t.Parallel()
		// The protocol's example subscription with a policy, on a bus of its
		// own ("inbound:*" would catch the other subtests' messages).
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		w := bus.client(t, "policy-suggester", "")
		w.send(`{
  "jsonrpc": "2.0",
  "method": "subscribe",
  "params": {
    "topic": "inbound:*",
    "policy": "stopPropagationOnProcessed"
  },
  "id": 1
}`)
		res := testenv.At[map[string]any](t, w.response(1), "result")
		if res["success"] != true || res["policy"] != "stopPropagationOnProcessed" {
			t.Errorf("subscribe with policy: %v", res)
		}
	})

	t.Run("untyped payload to an agent", func(t *testing.T) {
		t.Parallel()
		agent := bus.client(t, "typed-agent", `,"capabilities":{"processMessage":true}`)
		agent.subscribe(2, "agent:typed", "")
		pub := bus.client(t, "untyped-publisher", "")
		code, msg := pub.callError(3, "sendMessage", `{"topic":"agent:typed","payload":{"text":"no type"}}`)
		if code != -32602 || !contains(msg, "type") {
			t.Errorf("untyped payload to an agent: %d %q, want -32602 naming type", code, msg)
		}
	})

	t.Run("last match wins and stopPropagation", func(t *testing.T) {
		t.Parallel()
		// The protocol's example: A "inbound:*", B "inbound:critical", C
		// "inbound:*". stopPropagationOnStop delivers one at a time, so the
		// order is visible: C, then B, then A. A bus of its own, as
		// "inbound:*" would catch the other subtests' messages.
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		a := bus.client(t, "handler-a", "")
		a.subscribe(2, "inbound:*", "stopPropagationOnStop")
		b := bus.client(t, "handler-b", "")
		b.subscribe(2, "inbound:critical", "stopPropagationOnStop")
		c := bus.client(t, "handler-c", "")
		c.subscribe(2, "inbound:*", "stopPropagationOnStop")
		pub := bus.client(t, "order-publisher", "")

		pub.publish(10, "inbound:critical", `{"text":"first"}`)
		id, _ := c.expectRequest("sendMessage")
		c.reply(id, `{"success":true,"stopPropagation":false}`)
		id, _ = b.expectRequest("sendMessage")
		b.reply(id, `{"success":true,"stopPropagation":false}`)
		id, _ = a.expectRequest("sendMessage")
		a.reply(id, `{"success":true,"stopPropagation":false}`)
		res := testenv.At[map[string]any](t, pub.response(10), "result")
		var order []string
		for _, ack := range testenv.At[[]any](t, res, "acks") {
			order = append(order, testenv.At[string](t, ack, "client_id"))
		}
		if got := mustJSON(t, order); got != `["handler-c","handler-b","handler-a"]` {
			t.Errorf("delivery order %s", got)
		}

		// The protocol's handler response with stopPropagation: B is never called.
		pub.publish(11, "inbound:critical", `{"text":"second"}`)
		id, _ = c.expectRequest("sendMessage")
		c.reply(id, `{"processed": true, "stopPropagation": true, "message": "Rate limit exceeded"}`)
		res = testenv.At[map[string]any](t, pub.response(11), "result")
		if res["stopPropagation"] != true || len(testenv.At[[]any](t, res, "acks")) != 1 {
			t.Errorf("after stopPropagation: %v", res)
		}
		pub.result(12, "ping", `{}`)
		b.result(3, "ping", `{}`) // B's next frame is this answer, not a delivery
	})

	t.Run("policies", func(t *testing.T) {
		t.Parallel()
		// Default policy: the first subscriber that processes stops it.
		first := bus.client(t, "policy-first", "")
		first.subscribe(2, "policy:default", "")
		second := bus.client(t, "policy-second", "")
		second.subscribe(2, "policy:default", "")
		pub := bus.client(t, "policy-publisher", "")
		pub.publish(3, "policy:default", `{"text":"x"}`)
		id, _ := second.expectRequest("sendMessage")
		second.reply(id, `{"processed":true}`)
		if res := testenv.At[map[string]any](t, pub.response(3), "result"); len(testenv.At[[]any](t, res, "acks")) != 1 || res["stopPropagation"] != true {
			t.Errorf("stopPropagationOnProcessed: %v", res)
		}
		first.result(3, "ping", `{}`)

		// continueAll: every subscriber, even after one stops.
		x := bus.client(t, "policy-x", "")
		x.subscribe(2, "policy:all", "continueAll")
		y := bus.client(t, "policy-y", "")
		y.subscribe(2, "policy:all", "continueAll")
		pub.publish(4, "policy:all", `{"text":"y"}`)
		for _, w := range []*wire{x, y} {
			id, _ := w.expectRequest("sendMessage")
			w.reply(id, `{"processed":true,"stopPropagation":true}`)
		}
		if res := testenv.At[map[string]any](t, pub.response(4), "result"); len(testenv.At[[]any](t, res, "acks")) != 2 {
			t.Errorf("continueAll: %v", res)
		}
	})
}
