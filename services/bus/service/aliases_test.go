package service_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// Current bub clients name a topic address (subscribe, unsubscribe) or to
// (sendMessage), and send from and messageId; the protocol's clients send
// topic. An old-form and a new-form client share one topic here, each
// receiving what the other publishes, with the topic under both names and
// the sender and message id that current clients read.
func TestTopicAliases(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, nil), busOption{})
	old := bus.client(t, "old-1", "")
	old.subscribe(2, "room:1", "")
	cur := bus.client(t, "tg:42", "")
	if res := cur.result(2, "subscribe", `{"address":"room:1"}`); res["success"] != true {
		t.Fatalf("subscribe by address: %v", res)
	}

	// delivered checks a delivery's params and answers it.
	delivered := func(w *wire, from, messageID string) {
		t.Helper()
		id, p := w.expectRequest("sendMessage")
		if p["topic"] != "room:1" || p["to"] != "room:1" || p["from"] != from || testenv.At[map[string]any](t, p, "payload")["type"] != "chat" {
			t.Errorf("delivery %v, want topic and to room:1, from %s", p, from)
		}
		if got, _ := p["messageId"].(string); got == "" || (messageID != "" && got != messageID) {
			t.Errorf("delivery messageId %v, want %q", p["messageId"], messageID)
		}
		w.reply(id, `{"success":true,"stopPropagation":false}`)
	}
	// The latest subscription is delivered to first ("last match wins"):
	// the new-form client, then the old-form one.

	// New form to both: its own delivery, then the old client's.
	cur.send(`{"jsonrpc":"2.0","id":3,"method":"sendMessage","params":{"from":"tg:42","to":"room:1","messageId":"msg_01J","payload":{"type":"chat","text":"hello"}}}`)
	delivered(cur, "tg:42", "msg_01J")
	delivered(old, "tg:42", "msg_01J")
	res := testenv.At[map[string]any](t, cur.response(3), "result")
	if res["success"] != true || len(testenv.At[[]any](t, res, "acks")) != 2 {
		t.Errorf("new-form publish result %v", res)
	}

	// Old form to both: the sender is its clientId, the id the bus's own,
	// the same in every delivery.
	old.publish(3, "room:1", `{"type":"chat","text":"hi"}`)
	id, p := cur.expectRequest("sendMessage")
	busID, _ := p["messageId"].(string)
	if p["to"] != "room:1" || p["from"] != "old-1" || busID == "" {
		t.Errorf("old-form message delivered as %v", p)
	}
	cur.reply(id, `{"success":true}`)
	delivered(old, "old-1", busID)
	if res := testenv.At[map[string]any](t, old.response(3), "result"); res["success"] != true || len(testenv.At[[]any](t, res, "acks")) != 2 {
		t.Errorf("old-form publish result %v", res)
	}

	// Each leaves as it came.
	if res := cur.result(4, "unsubscribe", `{"address":"room:1"}`); res["success"] != true {
		t.Errorf("unsubscribe by address: %v", res)
	}
	if res := old.result(4, "unsubscribe", `{"topic":"room:1"}`); res["success"] != true {
		t.Errorf("unsubscribe by topic: %v", res)
	}
	// to names a subscription's topic too, and two names agreeing are one.
	if res := cur.result(5, "subscribe", `{"to":"room:2"}`); res["success"] != true {
		t.Errorf("subscribe by to: %v", res)
	}
	if res := cur.result(6, "unsubscribe", `{"topic":"room:2","address":"room:2"}`); res["success"] != true {
		t.Errorf("unsubscribe by topic and address alike: %v", res)
	}
}

// A request naming two different topics, or none under any name the bus
// knows, is -32602 naming the members concerned.
func TestTopicAliasErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, nil), busOption{})
	w := bus.client(t, "errors", "")
	tests := []struct {
		method, params string
		want           []string // in the error message
	}{
		{"subscribe", `{"topic":"a:1","address":"a:2"}`, []string{`topic "a:1"`, `address "a:2"`}},
		{"subscribe", `{"address":"a:1","to":"a:2"}`, []string{`address "a:1"`, `to "a:2"`}},
		{"unsubscribe", `{"topic":"a:1","to":"a:2"}`, []string{`topic "a:1"`, `to "a:2"`}},
		{"sendMessage", `{"topic":"a:1","to":"a:2","payload":{"type":"t"}}`, []string{`topic "a:1"`, `to "a:2"`}},
		{"subscribe", `{"channel":"a:1"}`, []string{`"topic"`, `"address"`, `"to"`}},
		{"unsubscribe", `{"name":"a:1"}`, []string{`"topic"`, `"address"`, `"to"`}},
		{"sendMessage", `{"destination":"a:1","payload":{"type":"t"}}`, []string{`"topic"`, `"address"`, `"to"`, "default topic"}},
		{"subscribe", `{"address":5}`, []string{"address must be a string"}},
		{"subscribe", `{"address":""}`, []string{"address: topic is empty"}},
		{"sendMessage", `{"to":"a:1","from":"","payload":{"type":"t"}}`, []string{"from must be"}},
		{"sendMessage", `{"to":"a:1","from":7,"payload":{"type":"t"}}`, []string{"from must be a string"}},
		{"sendMessage", `{"to":"a:1","messageId":"` + strings.Repeat("m", 257) + `","payload":{"type":"t"}}`, []string{"messageId must be"}},
		{"sendMessage", `{"to":"a:1","messageId":"a\u0007b","payload":{"type":"t"}}`, []string{"messageId must be"}},
	}
	for i, tt := range tests {
		code, msg := w.callError(10+i, tt.method, tt.params)
		if code != -32602 {
			t.Errorf("%s %s: code %d (%s), want -32602", tt.method, tt.params, code, msg)
			continue
		}
		for _, want := range tt.want {
			if !strings.Contains(msg, want) {
				t.Errorf("%s %s: message %q lacks %s", tt.method, tt.params, msg, fmt.Sprint(want))
			}
		}
	}
}
