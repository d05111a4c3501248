package service_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/service"
)

// elsewhereLauncher stands in for the runner of one replica, in this test
// only: the agent it starts dials another replica (as an agent behind a
// load balancer may), with the environment it was given. The launches of
// every replica's launcher are counted together.
type elsewhereLauncher struct {
	t        *testing.T
	target   func() string // the replica the agent lands on
	launches *atomic.Int32
	agents   chan launched
}

type launched struct {
	w   *wire
	req service.LaunchRequest
}

func (l *elsewhereLauncher) Launch(_ context.Context, req service.LaunchRequest) error {
	l.launches.Add(1)
	go func() {
		w := dial(l.t, l.target(), bearer(req.Token))
		w.initialize(req.AgentID, "")
		w.subscribe(2, req.DefaultTopic, "")
		l.agents <- launched{w: w, req: req}
	}()
	return nil
}

// twoReplicasWithLaunchers runs two buses on one store and queue, each
// with a launcher whose agents dial the other.
func twoReplicasWithLaunchers(t *testing.T, env map[string]string) (a, b *testBus, launches *atomic.Int32, agents chan launched) {
	t.Helper()
	launches = &atomic.Int32{}
	agents = make(chan launched, 4)
	var aURL, bURL atomic.Pointer[string]
	la := &elsewhereLauncher{t: t, target: func() string { return *bURL.Load() }, launches: launches, agents: agents}
	lb := &elsewhereLauncher{t: t, target: func() string { return *aURL.Load() }, launches: launches, agents: agents}
	cfg := map[string]string{"CONCLAVE_BUS_PEER_TOKEN": "peer-token-0123456789", "CONCLAVE_BUS_SPAWN_TIMEOUT": "20s"}
	for k, v := range env {
		cfg[k] = v
	}
	a = startBus(t, withID(defaultConfig(t, cfg), "bus-a"), busOption{launcher: la})
	b = startBus(t, withID(defaultConfig(t, cfg), "bus-b"), busOption{st: a.st, q: a.queue, launcher: lb})
	aURL.Store(&a.url)
	bURL.Store(&b.url)
	for {
		page, err := a.st.Query(context.Background(), service.ReplicaTable.Name, store.Query{PK: "replica"})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) == 2 {
			break
		}
	}
	return a, b, launches, agents
}

// TestDefaultHandlerAcrossReplicas: the agent the default handler of one
// replica launches may subscribe on another, and messages on both replicas
// for one unrouted topic launch one agent between them.
func TestDefaultHandlerAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts two buses")
	}
	t.Parallel()

	t.Run("the agent subscribes on the other replica", func(t *testing.T) {
		t.Parallel()
		a, _, launches, agents := twoReplicasWithLaunchers(t, nil)
		pub := a.client(t, "bridge-on-a", "")
		pub.publish(2, "tg:1001", `{"type":"telegram_message","text":"hello","chat_id":"1001"}`)
		agent := receive(t, agents, "launched agent")
		id, params := agent.w.expectRequest("processMessage")
		if params["topic"] != "tg:1001" || params["attempt"] != float64(1) {
			t.Errorf("delivered %v", params)
		}
		agent.w.reply(id, `{"processed":true,"message":"hi from b"}`)
		res := testenv.At[map[string]any](t, pub.response(2), "result")
		acks := testenv.At[[]any](t, res, "acks")
		if res["success"] != true || len(acks) != 1 {
			t.Fatalf("result %v", res)
		}
		ack := testenv.At[map[string]any](t, acks, 0)
		if ack["processed"] != true || ack["client_id"] != agent.req.AgentID || ack["message"] != "hi from b" {
			t.Errorf("ack %v", ack)
		}
		if n := launches.Load(); n != 1 {
			t.Errorf("%d launches, want 1", n)
		}
		// The agent is an agent on the replica it dialled, with the topic
		// it was launched for as its default topic: its untyped message
		// there goes to its own (agent) subscription and is refused.
		if code, msg := agent.w.callError(9, "sendMessage", `{"payload":{"text":"untyped"}}`); code != -32602 || !contains(msg, "type") {
			t.Errorf("the agent's sendMessage without a topic: %d %s", code, msg)
		}
		// The next message, from replica a, is routed to it through b.
		pub.publish(3, "tg:1001", `{"type":"telegram_message","text":"again"}`)
		id, _ = agent.w.expectRequest("processMessage")
		agent.w.reply(id, `{"processed":true}`)
		if res := testenv.At[map[string]any](t, pub.response(3), "result"); res["success"] != true {
			t.Errorf("second message %v", res)
		}
		if n := launches.Load(); n != 1 {
			t.Errorf("%d launches after the second message, want 1", n)
		}
	})

	t.Run("messages on both replicas launch one agent", func(t *testing.T) {
		t.Parallel()
		a, b, launches, agents := twoReplicasWithLaunchers(t, nil)
		const perReplica = 3
		var pubs []*wire
		for i := range perReplica {
			for _, bus := range []*testBus{a, b} {
				p := bus.client(t, fmt.Sprintf("bridge-%d", i), "")
				pubs = append(pubs, p)
			}
		}
		// All at once: each publish is sent before any is answered.
		var wg sync.WaitGroup
		for _, p := range pubs {
			wg.Go(func() { p.publish(2, "tg:2002", `{"type":"telegram_message","text":"hello"}`) })
		}
		wg.Wait()
		agent := receive(t, agents, "launched agent")
		for range len(pubs) {
			id, params := agent.w.expectRequest("processMessage")
			if params["topic"] != "tg:2002" {
				t.Errorf("delivered %v", params)
			}
			agent.w.reply(id, `{"processed":true}`)
		}
		for _, p := range pubs {
			res := testenv.At[map[string]any](t, p.response(2), "result")
			acks := testenv.At[[]any](t, res, "acks")
			if res["success"] != true || len(acks) != 1 || testenv.At[map[string]any](t, acks, 0)["client_id"] != agent.req.AgentID ||
				testenv.At[map[string]any](t, acks, 0)["processed"] != true {
				t.Errorf("result %v", res)
			}
		}
		if n := launches.Load(); n != 1 {
			t.Errorf("%d launches for one topic across two replicas, want 1", n)
		}
		select {
		case extra := <-agents:
			t.Errorf("a second agent %s was launched", extra.req.AgentID)
		default:
		}
	})
}
