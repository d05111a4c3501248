package service_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// TestLaunchedAgentToken: with tokens required, the agent the default
// handler launches authenticates with the token it was given (BUB_TOKEN),
// which allows exactly agent:{its id} and the topic it was launched for.
func TestLaunchedAgentToken(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	grants := `[
 {"token":"bridge-token-0123456789","client_id":"tg-bridge","publish":["tg:*"],"subscribe":["outbound:*"]},
 {"token":"other-agent-token-0123456789","client_id":"agent-other","publish":["agent:agent-other"],"subscribe":["agent:agent-other"]}
]`
	l := &fakeLauncher{t: t, agents: make(chan *wire, 1)}
	bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_GRANTS": grants,
		"CONCLAVE_BUS_AGENT_REPLY_TOPICS": "tg:*=outbound:{topic_id}"}), busOption{launcher: l})

	other := dial(t, bus.url, bearer("other-agent-token-0123456789"))
	other.initialize("agent-other", agentCaps)
	other.subscribe(2, "agent:agent-other", "")

	bridge := dial(t, bus.url, bearer("bridge-token-0123456789"))
	bridge.initialize("tg-bridge", "")
	bridge.publish(2, "tg:5005", `{"type":"telegram_message","text":"hello"}`)
	// The launched agent dialled with its token in the upgrade, initialized
	// as its id and subscribed to its topic (fakeLauncher fails the test
	// otherwise), and takes the message.
	agent := receive(t, l.agents, "launched agent")
	id, params := agent.expectRequest("processMessage")
	if params["topic"] != "tg:5005" {
		t.Errorf("delivered %v", params)
	}
	agent.reply(id, `{"processed":true}`)
	if res := testenv.At[map[string]any](t, bridge.response(2), "result"); res["success"] != true {
		t.Fatalf("result %v", res)
	}
	req := l.got[0]

	// Its own agent: topic: allowed.
	agent.subscribe(3, "agent:"+req.AgentID, "")
	// Another agent's topic, every agent's, another chat's: refused.
	for i, pattern := range []string{"agent:agent-other", "agent:*", "tg:*", "tg:5006"} {
		if code, msg := agent.callError(10+i, "subscribe", `{"topic":"`+pattern+`"}`); code != broker.CodeForbidden {
			t.Errorf("the launched agent subscribing to %s: %d %s, want -32005", pattern, code, msg)
		}
	}
	for i, to := range []string{"agent:agent-other", "tg:5006", "outbound:5006", "outbound:*"} {
		if code, msg := agent.callError(20+i, "sendMessage", `{"topic":"`+to+`","payload":{"type":"task_request"}}`); code != broker.CodeForbidden {
			t.Errorf("the launched agent publishing on %s: %d %s, want -32005", to, code, msg)
		}
	}
	// The other agent saw nothing: its next frame answers its own call.
	other.result(3, "ping", `{}`)

	// Its reply topic (CONCLAVE_BUS_AGENT_REPLY_TOPICS tg:*=outbound:{topic_id}):
	// outbound:5005 for tg:5005, which the bridge takes.
	bridge.subscribe(3, "outbound:*", "")
	agent.publish(30, "outbound:5005", `{"type":"telegram_reply","text":"hi"}`)
	id, params = bridge.expectRequest("sendMessage")
	if params["topic"] != "outbound:5005" {
		t.Errorf("the bridge got %v", params)
	}
	bridge.reply(id, `{"processed":true}`)
	if res := testenv.At[map[string]any](t, agent.response(30), "result"); res["success"] != true {
		t.Fatalf("the agent's reply on outbound:5005: %v", res)
	}

	// The token in initialize works as in the upgrade, for the agent's id
	// only.
	again := dial(t, bus.url, nil)
	again.initialize(req.AgentID, `,"token":"`+req.Token+`"`)
	again.subscribe(2, req.DefaultTopic, "")
	impostor := dial(t, bus.url, nil)
	if code, _ := impostor.callError(1, "initialize", `{"clientId":"agent-other","token":"`+req.Token+`"}`); code != broker.CodeForbidden {
		t.Errorf("initializing as another id with the launched agent's token: %d, want -32005", code)
	}
	// It is no admin's token.
	if status := getJSONWithHeader(t, bus.http+"/v1/dead-letters", bearer(req.Token)); status != http.StatusForbidden {
		t.Errorf("dead letters with the launched agent's token: %d, want 403", status)
	}
	// A token the bus never minted is refused at the upgrade.
	if status := getJSONWithHeader(t, bus.http+"/", bearer(req.Token+"x")); status != http.StatusUnauthorized {
		t.Errorf("upgrade with an unknown token: %d, want 401", status)
	}
}

// outageStore fails every read of the launched agents' tokens while down.
type outageStore struct {
	store.Store
	down atomic.Bool
}

func (s *outageStore) Get(ctx context.Context, table string, key store.Key) (store.Item, error) {
	if table == broker.LaunchTable.Name && s.down.Load() {
		return store.Item{}, errors.New("store unavailable (test)")
	}
	return s.Store.Get(ctx, table, key)
}

// TestTokenCheckOutage: a token the bus cannot check because its store is
// failing gets 503 with Retry-After and no store error text, at the
// WebSocket upgrade and on the dead-letter API; a token it checked and
// does not know gets 401. (Both were 401 with the store's error before.)
func TestTokenCheckOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	outage := &outageStore{Store: st}
	l := &fakeLauncher{t: t, agents: make(chan *wire, 1)}
	// Tokens required (a grant list), so that a token is checked at all.
	grants := `[{"token":"admin-token-0123456789","client_id":"ops","publish":["*"],"subscribe":["*"],"admin":true}]`
	bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_GRANTS": grants}), busOption{st: outage, launcher: l})
	client := &http.Client{Timeout: 10 * time.Second}
	upgrade := func() (int, string, string) {
		req, err := http.NewRequest(http.MethodGet, strings.Replace(bus.url, "ws://", "http://", 1), nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range bearer("unknown-token-0123456789") {
			req.Header[k] = v
		}
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
	}
	deadLetters := func() int {
		req, err := http.NewRequest(http.MethodGet, bus.http+"/v1/dead-letters", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range bearer("unknown-token-0123456789") {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code, _, body := upgrade(); code != http.StatusUnauthorized {
		t.Errorf("an unknown token: HTTP %d %s, want 401", code, body)
	}
	outage.down.Store(true)
	if code, retry, body := upgrade(); code != http.StatusServiceUnavailable || retry == "" || strings.Contains(body, "store unavailable") {
		t.Errorf("a token the store cannot check: HTTP %d Retry-After %q %s, want 503 with Retry-After and no store error", code, retry, body)
	}
	if code := deadLetters(); code != http.StatusServiceUnavailable {
		t.Errorf("the dead-letter API with a token the store cannot check: HTTP %d, want 503", code)
	}
}
