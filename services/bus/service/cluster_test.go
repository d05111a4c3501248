package service_test

import (
	"context"
	"testing"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/service"
)

// TestTwoReplicas runs two buses on one store and queue, as two pods on
// DynamoDB and SQS: a subscriber on one receives what a publisher on the
// other sends, and an agent's retry reaches it whichever replica takes the
// retry from the queue.
func TestTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts two buses")
	}
	t.Parallel()
	env := map[string]string{"CONCLAVE_BUS_PEER_TOKEN": "peer-token-0123456789"}
	a := startBus(t, withID(defaultConfig(t, env), "bus-a"), busOption{})
	b := startBus(t, withID(defaultConfig(t, env), "bus-b"), busOption{st: a.st, q: a.queue})
	for {
		page, err := a.st.Query(context.Background(), service.ReplicaTable.Name, store.Query{PK: "replica"})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) == 2 {
			break
		}
	}

	bridge := a.client(t, "bridge-on-a", "")
	bridge.subscribe(2, "outbound:*", "")
	agent := a.client(t, "agent-on-a", agentCaps)
	agent.subscribe(2, "agent:on-a", "")
	pub := b.client(t, "publisher-on-b", "")

	pub.publish(3, "outbound:42", `{"text":"across replicas"}`)
	id, params := bridge.expectRequest("sendMessage")
	if params["topic"] != "outbound:42" {
		t.Errorf("delivered %v", params)
	}
	bridge.reply(id, `{"success":true,"processed":true,"message":"sent"}`)
	res := testenv.At[map[string]any](t, pub.response(3), "result")
	acks := testenv.At[[]any](t, res, "acks")
	if res["success"] != true || len(acks) != 1 || testenv.At[map[string]any](t, acks, 0)["client_id"] != "bridge-on-a" {
		t.Errorf("result across replicas %v", res)
	}

	pub.publish(4, "agent:on-a", `{"type":"task_request","task_id":"x"}`)
	id, _ = agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":false,"should_retry":true,"retry_seconds":1}`)
	pub.response(4)
	id, params = agent.expectRequest("processMessage")
	if params["attempt"] != float64(2) {
		t.Errorf("retry across replicas %v", params)
	}
	agent.reply(id, `{"processed":true}`)

	// Unrouted everywhere is still unrouted.
	if res := pub.result(5, "sendMessage", `{"topic":"nobody:1","payload":{"text":"x"}}`); res["success"] != false {
		t.Errorf("unrouted across replicas %v", res)
	}
}

func withID(cfg service.Config, id string) service.Config {
	cfg.ServerID = id
	return cfg
}
