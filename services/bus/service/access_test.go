package service_test

import (
	"net/http"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

const grants = `[
 {"token":"bridge-token-0123456789","client_id":"tg-bridge","publish":["tg:*"],"subscribe":["outbound:*"]},
 {"token":"agent-token-0123456789","publish":["outbound:*","agent:*"],"subscribe":["agent:{client_id}","tg:*"]},
 {"token":"narrow-token-0123456789","publish":[],"subscribe":["tg:1?"]},
 {"token":"admin-token-0123456789","publish":["*"],"subscribe":["*"],"admin":true}
]`

func bearer(token string) http.Header {
	return http.Header{"Authorization": []string{"Bearer " + token}}
}

func TestAccessControl(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_GRANTS": grants}), busOption{})

	t.Run("no token", func(t *testing.T) {
		t.Parallel()
		w := dial(t, bus.url, nil)
		if code, msg := w.callError(1, "initialize", `{"clientId":"anon"}`); code != broker.CodeForbidden || !contains(msg, "Unauthenticated") {
			t.Errorf("initialize without a token: %d %s", code, msg)
		}
		if code, _ := w.callError(2, "subscribe", `{"topic":"*"}`); code != broker.CodeNotInitialized {
			t.Errorf("subscribe after a refused initialize: %d", code)
		}
	})

	t.Run("unknown token at the upgrade", func(t *testing.T) {
		t.Parallel()
		status := getJSONWithHeader(t, bus.http+"/", bearer("wrong-token-0123456789"))
		if status != http.StatusUnauthorized {
			t.Errorf("upgrade with an unknown token: %d, want 401", status)
		}
	})

	t.Run("token in initialize", func(t *testing.T) {
		t.Parallel()
		w := dial(t, bus.url, nil)
		w.initialize("agent-x", `,"token":"agent-token-0123456789"`)
		w.subscribe(2, "agent:agent-x", "")
	})

	t.Run("agent confined to its own topic", func(t *testing.T) {
		t.Parallel()
		a := dial(t, bus.url, bearer("agent-token-0123456789"))
		a.initialize("agent-a", agentCaps)
		a.subscribe(2, "agent:agent-a", "")
		if code, _ := a.callError(3, "subscribe", `{"topic":"agent:agent-b"}`); code != broker.CodeForbidden {
			t.Errorf("subscribe to another agent's topic: %d", code)
		}
		if code, _ := a.callError(4, "subscribe", `{"topic":"agent:*"}`); code != broker.CodeForbidden {
			t.Errorf("subscribe to every agent's topic: %d", code)
		}
		if code, _ := a.callError(5, "sendMessage", `{"topic":"inbound:x","payload":{"type":"t"}}`); code != broker.CodeForbidden {
			t.Errorf("publish outside the grant: %d", code)
		}
		a.subscribe(6, "tg:chat-a", "")
		bridge := dial(t, bus.url, bearer("bridge-token-0123456789"))
		bridge.initialize("tg-bridge", "")
		bridge.publish(2, "tg:chat-a", `{"type":"telegram_message","text":"hi"}`)
		id, _ := a.expectRequest("processMessage")
		a.reply(id, `{"processed":true}`)
		bridge.response(2)
	})

	t.Run("a pattern never widens a grant", func(t *testing.T) {
		t.Parallel()
		// "tg:1*" passes the textual check against the grant's "tg:1?",
		// but carries only the topics "tg:1?" itself allows.
		narrow := dial(t, bus.url, bearer("narrow-token-0123456789"))
		narrow.initialize("narrow", "")
		narrow.subscribe(2, "tg:1*", "")
		bridge := dial(t, bus.url, bearer("bridge-token-0123456789"))
		bridge.initialize("tg-bridge", "")
		if res := bridge.result(2, "sendMessage", `{"topic":"tg:1234","payload":{"text":"wide"}}`); len(testenv.At[[]any](t, res, "acks")) != 0 {
			t.Errorf("tg:1234 reached a client allowed only tg:1?: %v", res)
		}
		bridge.publish(3, "tg:12", `{"text":"narrow"}`)
		id, params := narrow.expectRequest("sendMessage")
		if params["topic"] != "tg:12" {
			t.Errorf("delivered %v", params)
		}
		narrow.reply(id, `{"success":true}`)
		bridge.response(3)
	})

	t.Run("bridge bound to its client id", func(t *testing.T) {
		t.Parallel()
		w := dial(t, bus.url, bearer("bridge-token-0123456789"))
		if code, _ := w.callError(1, "initialize", `{"clientId":"someone-else"}`); code != broker.CodeForbidden {
			t.Errorf("initialize as another client id: %d", code)
		}
	})

	t.Run("other clients never see a denied message", func(t *testing.T) {
		t.Parallel()
		admin := dial(t, bus.url, bearer("admin-token-0123456789"))
		admin.initialize("auditor", "")
		admin.subscribe(2, "denied:*", "")
		a := dial(t, bus.url, bearer("agent-token-0123456789"))
		a.initialize("agent-c", "")
		if code, _ := a.callError(2, "sendMessage", `{"topic":"denied:1","payload":{"type":"t"}}`); code != broker.CodeForbidden {
			t.Errorf("denied publish: %d", code)
		}
		admin.result(3, "ping", `{}`) // the auditor's next frame: no delivery came first
	})

	t.Run("dead letters need an admin token", func(t *testing.T) {
		t.Parallel()
		if status := getJSONWithHeader(t, bus.http+"/v1/dead-letters", nil); status != http.StatusUnauthorized {
			t.Errorf("without a token: %d", status)
		}
		if status := getJSONWithHeader(t, bus.http+"/v1/dead-letters", bearer("agent-token-0123456789")); status != http.StatusForbidden {
			t.Errorf("with an agent's token: %d", status)
		}
		if status := getJSONWithHeader(t, bus.http+"/v1/dead-letters", bearer("admin-token-0123456789")); status != http.StatusOK {
			t.Errorf("with an admin's token: %d", status)
		}
	})
}

func getJSONWithHeader(t *testing.T, url string, h http.Header) int {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
