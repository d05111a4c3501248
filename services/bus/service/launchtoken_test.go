package service_test

import (
	"net/http"
	"testing"

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
	bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_GRANTS": grants}), busOption{launcher: l})

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
	if res := bridge.response(2)["result"].(map[string]any); res["success"] != true {
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
	for i, to := range []string{"agent:agent-other", "tg:5006", "outbound:5005"} {
		if code, msg := agent.callError(20+i, "sendMessage", `{"topic":"`+to+`","payload":{"type":"task_request"}}`); code != broker.CodeForbidden {
			t.Errorf("the launched agent publishing on %s: %d %s, want -32005", to, code, msg)
		}
	}
	// The other agent saw nothing: its next frame answers its own call.
	other.result(3, "ping", `{}`)

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
