package service_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

// TestMetrics drives every event of docs/metrics.md's ## bus table and
// checks the metric moved, and that client-chosen values (topics, client
// ids) never become labels.
func TestMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	l := &fakeLauncher{t: t, agents: make(chan *wire, 1)}
	failing := &fakeLauncher{t: t, fail: errors.New("runner down")}
	cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_RETRY_ATTEMPTS": "2", "CONCLAVE_BUS_RATE": "1000000", "CONCLAVE_BUS_BURST": "1000000"})
	bus := startBus(t, cfg, busOption{launcher: l})

	// routed, processed, retry, failed, retries_scheduled, dead letter.
	agent := bus.client(t, "agent-m", agentCaps)
	agent.subscribe(2, "agent:m", "")
	base := bus.client(t, "base-m", "")
	base.subscribe(2, "base:m", "")
	pub := bus.client(t, "pub-m", "")
	pub.publish(3, "base:m", `{"text":"x"}`)
	id, _ := base.expectRequest("sendMessage")
	base.reply(id, `{"success":true}`)
	pub.response(3)
	pub.publish(4, "agent:m", `{"type":"t"}`)
	id, _ = agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":false,"should_retry":true,"retry_seconds":1}`)
	pub.response(4)
	id, _ = agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":false,"should_retry":true,"retry_seconds":1}`)
	var dl deadLetters
	for len(dl.DeadLetters) == 0 {
		agent.result(5, "ping", `{}`)
		getJSON(t, "GET", bus.http+"/v1/dead-letters", &dl)
	}
	pub.publish(6, "agent:m", `{"type":"t"}`)
	id, _ = agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":true}`)
	pub.response(6)
	// rejected, default handler with a spawn.
	pub.callError(7, "sendMessage", `{"topic":"agent:m","payload":{"text":"untyped"}}`)
	pub.publish(8, "tg:metrics", `{"type":"telegram_message"}`)
	spawned := receive(t, l.agents, "launched agent")
	id, _ = spawned.expectRequest("processMessage")
	spawned.reply(id, `{"processed":true}`)
	pub.response(8)
	// A failed spawn, on a bus of its own.
	other := startBus(t, defaultConfig(t, nil), busOption{launcher: failing})
	other.client(t, "pub", "").result(2, "sendMessage", `{"topic":"tg:x","payload":{"type":"t"}}`)
	// Unrouted: 10,000 distinct topics, which must not become series.
	unrouted := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_RATE": "1000000", "CONCLAVE_BUS_BURST": "1000000",
		"CONCLAVE_BUS_MAX_FRAME_BYTES": "4194304"}), busOption{})
	w := unrouted.client(t, "spray", "")
	var b strings.Builder
	b.WriteString("[")
	for i := range 10000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"jsonrpc":"2.0","method":"sendMessage","params":{"topic":"nobody:%d","payload":{"text":"x"}},"id":%d}`, i, i)
	}
	b.WriteString("]")
	w.send(b.String())
	w.recvRaw()

	m := metricstest.Scrape(t, bus.http+"/metrics")
	// The subscriptions gauge follows an unsubscribe.
	base.result(9, "unsubscribe", `{"topic":"base:m"}`)
	afterUnsubscribe := metricstest.Scrape(t, bus.http+"/metrics").Value("conclave_bus_subscriptions")
	if got, want := afterUnsubscribe, m.Value("conclave_bus_subscriptions")-1; got != want {
		t.Errorf("conclave_bus_subscriptions after an unsubscribe: %v, want %v", got, want)
	}
	mt := metricstest.Scrape(t, throttledBus(t).http+"/metrics")
	mf := metricstest.Scrape(t, other.http+"/metrics")
	mu := metricstest.Scrape(t, unrouted.http+"/metrics")
	checks := []struct {
		name  string
		value float64
	}{
		{"conclave_bus_connections", m.Value("conclave_bus_connections")},
		{"conclave_bus_subscriptions", m.Value("conclave_bus_subscriptions")},
		{"conclave_bus_delivery_latency_seconds", m.Value("conclave_bus_delivery_latency_seconds", "method", "sendMessage") *
			m.Value("conclave_bus_delivery_latency_seconds", "method", "processMessage")},
		{"conclave_bus_messages_published_total", m.Value("conclave_bus_messages_published_total", "outcome", "routed") *
			m.Value("conclave_bus_messages_published_total", "outcome", "rejected") *
			m.Value("conclave_bus_messages_published_total", "outcome", "default_handler") *
			mu.Value("conclave_bus_messages_published_total", "outcome", "unrouted")},
		{"conclave_bus_deliveries_total", m.Value("conclave_bus_deliveries_total", "method", "processMessage", "outcome", "retry") *
			m.Value("conclave_bus_deliveries_total", "method", "processMessage", "outcome", "processed") *
			m.Value("conclave_bus_deliveries_total", "method", "sendMessage", "outcome", "answered")},
		{"conclave_bus_retries_scheduled_total", m.Value("conclave_bus_retries_scheduled_total")},
		{"conclave_bus_dead_letters_total", m.Value("conclave_bus_dead_letters_total", "reason", "attempts") *
			mf.Value("conclave_bus_dead_letters_total", "reason", "spawn_failed")},
		{"conclave_bus_auth_throttled_total", mt.Value("conclave_bus_auth_throttled_total")},
		{"conclave_bus_agent_spawns_total", m.Value("conclave_bus_agent_spawns_total", "outcome", "ok") *
			mf.Value("conclave_bus_agent_spawns_total", "outcome", "failed")},
	}
	var tested []string
	for _, c := range checks {
		tested = append(tested, c.name)
		if c.value <= 0 {
			t.Errorf("%s did not move", c.name)
		}
	}
	if got := mu.Value("conclave_bus_messages_published_total", "outcome", "unrouted"); got != 10000 {
		t.Errorf("unrouted messages: %v, want 10000", got)
	}
	if n := mu.Series("conclave_bus_"); n > 20 {
		t.Errorf("%d bus series after 10,000 distinct topics", n)
	}
	documented := metricstest.DocumentedNames(t, "bus")
	slices.Sort(tested)
	slices.Sort(documented)
	if !slices.Equal(tested, documented) {
		t.Errorf("tested %v, documented %v", tested, documented)
	}
}
