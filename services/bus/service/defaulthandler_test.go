package service_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/service"
)

// fakeLauncher stands in for the runner, in this test only: instead of a
// process it starts a goroutine that connects to the bus as the launched
// agent would, with the environment it was given.
type fakeLauncher struct {
	t        *testing.T
	launches atomic.Int32
	fail     error
	// silent agents never subscribe.
	silent bool
	mu     sync.Mutex
	got    []service.LaunchRequest
	agents chan *wire
}

func (l *fakeLauncher) Launch(_ context.Context, req service.LaunchRequest) error {
	l.launches.Add(1)
	l.mu.Lock()
	l.got = append(l.got, req)
	l.mu.Unlock()
	if l.fail != nil {
		return l.fail
	}
	if l.silent {
		return nil
	}
	go func() {
		// BUB_BUS_URL, BUB_AGENT_ID, BUB_DEFAULT_TOPIC and BUB_TOKEN, as an
		// agent reads them.
		var header http.Header
		if req.Token != "" {
			header = bearer(req.Token)
		}
		w := dial(l.t, req.BusURL, header)
		w.initialize(req.AgentID, "")
		w.subscribe(2, req.DefaultTopic, "")
		l.agents <- w
	}()
	return nil
}

func TestDefaultHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()

	t.Run("one agent per unrouted topic", func(t *testing.T) {
		t.Parallel()
		l := &fakeLauncher{t: t, agents: make(chan *wire, 4)}
		cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_WORKSPACE": "/workspaces/tg"})
		bus := startBus(t, cfg, busOption{launcher: l})
		const n = 5
		pubs := make([]*wire, n)
		for i := range pubs {
			pubs[i] = bus.client(t, "bridge", "")
			pubs[i].publish(2, "tg:123456789", `{"type":"telegram_message","text":"hello","chat_id":"123456789"}`)
		}
		agent := receive(t, l.agents, "launched agent")
		for range n {
			id, params := agent.expectRequest("processMessage")
			if params["topic"] != "tg:123456789" {
				t.Errorf("delivered %v", params)
			}
			agent.reply(id, `{"processed":true,"message":"hi back"}`)
		}
		for _, p := range pubs {
			res := testenv.At[map[string]any](t, p.response(2), "result")
			ack := testenv.At[map[string]any](t, res, "acks", 0)
			if res["success"] != true || ack["processed"] != true {
				t.Errorf("result %v", res)
			}
		}
		if got := l.launches.Load(); got != 1 {
			t.Errorf("%d launches for one topic, want 1", got)
		}
		req := l.got[0]
		if req.Workspace != "/workspaces/tg" || req.DefaultTopic != "tg:123456789" || req.AgentID == "" || req.BusURL != bus.url || len(req.Token) < 32 {
			t.Errorf("launch request %+v", req)
		}
		// The launched agent's sendMessage without a topic goes to its
		// default topic.
		if code, _ := agent.callError(9, "sendMessage", `{"payload":{"text":"untyped"}}`); code != -32602 {
			t.Errorf("an untyped payload to the agent's own (agent) topic: %d, want -32602", code)
		}
	})

	t.Run("untyped payload", func(t *testing.T) {
		t.Parallel()
		l := &fakeLauncher{t: t, agents: make(chan *wire, 1)}
		bus := startBus(t, defaultConfig(t, nil), busOption{launcher: l})
		p := bus.client(t, "bridge", "")
		if code, msg := p.callError(2, "sendMessage", `{"topic":"tg:1","payload":{"text":"no type"}}`); code != -32602 || !contains(msg, "default handler") {
			t.Errorf("untyped unrouted: %d %s", code, msg)
		}
		if l.launches.Load() != 0 {
			t.Error("an untyped payload launched an agent")
		}
	})

	for _, tt := range []struct {
		name     string
		launcher *fakeLauncher
		reason   string
	}{
		{"launch fails", &fakeLauncher{fail: errors.New("runner: no capacity")}, "no capacity"},
		{"agent never subscribes", &fakeLauncher{silent: true}, "did not subscribe"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.launcher.t = t
			cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_SPAWN_TIMEOUT": "500ms"})
			bus := startBus(t, cfg, busOption{launcher: tt.launcher})
			p := bus.client(t, "bridge", "")
			res := p.result(2, "sendMessage", `{"topic":"tg:42","payload":{"type":"telegram_message","text":"hi"}}`)
			ack := testenv.At[map[string]any](t, res, "acks", 0)
			if ack["processed"] != false || !contains(testenv.At[string](t, ack, "message"), tt.reason) || !contains(testenv.At[string](t, ack, "message"), "dead-lettered") {
				t.Errorf("ack %v", ack)
			}
			var dl deadLetters
			getJSON(t, "GET", bus.http+"/v1/dead-letters", &dl)
			if len(dl.DeadLetters) != 1 || dl.DeadLetters[0].Topic != "tg:42" || !contains(dl.DeadLetters[0].LastError, tt.reason) {
				t.Errorf("dead letters %+v", dl)
			}
		})
	}
}
