package service_test

import (
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestBusWidePolicy: CONCLAVE_BUS_POLICY applies to subscriptions that
// suggest none, and with CONCLAVE_BUS_CLIENT_POLICIES=false to every
// subscription, whatever it suggests.
func TestBusWidePolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts buses")
	}
	t.Parallel()

	// twoSubscribers subscribes two clients to topic (the second last, so
	// delivered to first) with the suggested policy, checks the policy the
	// bus answers, publishes once, and returns the acks the publisher got.
	// Each subscriber answers processed and stopPropagation, so any policy
	// but continueAll stops after the first.
	twoSubscribers := func(t *testing.T, bus *testBus, topic, suggest, wantPolicy string) int {
		t.Helper()
		subs := make([]*wire, 2)
		for i := range subs {
			subs[i] = bus.client(t, topic+"-sub-"+string(rune('a'+i)), "")
			params := `{"topic":"` + topic + `"}`
			if suggest != "" {
				params = `{"topic":"` + topic + `","policy":"` + suggest + `"}`
			}
			if res := subs[i].result(2, "subscribe", params); res["policy"] != wantPolicy {
				t.Fatalf("subscribe %s suggesting %q: policy %v, want %s", topic, suggest, res["policy"], wantPolicy)
			}
		}
		pub := bus.client(t, topic+"-pub", "")
		pub.publish(3, topic, `{"text":"x"}`)
		want := 1
		if wantPolicy == "continueAll" {
			want = 2
		}
		// Delivered newest first; continueAll delivers to both at once.
		for i := len(subs) - 1; i >= len(subs)-want; i-- {
			id, _ := subs[i].expectRequest("sendMessage")
			subs[i].reply(id, `{"success":true,"processed":true,"stopPropagation":true}`)
		}
		res := testenv.At[map[string]any](t, pub.response(3), "result")
		for _, s := range subs {
			s.result(9, "ping", `{}`) // no delivery is left waiting for it
		}
		return len(testenv.At[[]any](t, res, "acks"))
	}

	t.Run("bus-wide default", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_POLICY": "continueAll"}), busOption{})
		// No suggestion: the bus-wide policy, every subscriber reached.
		if n := twoSubscribers(t, bus, "policy:none", "", "continueAll"); n != 2 {
			t.Errorf("continueAll by default: %d acks, want 2", n)
		}
		// A suggestion stands (CONCLAVE_BUS_CLIENT_POLICIES defaults to true).
		if n := twoSubscribers(t, bus, "policy:suggested", "stopPropagationOnProcessed", "stopPropagationOnProcessed"); n != 1 {
			t.Errorf("a suggested stopPropagationOnProcessed: %d acks, want 1", n)
		}
	})

	t.Run("client policies overridden", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_POLICY": "continueAll",
			"CONCLAVE_BUS_CLIENT_POLICIES": "false"}), busOption{})
		if n := twoSubscribers(t, bus, "policy:overridden", "stopPropagationOnProcessed", "continueAll"); n != 2 {
			t.Errorf("a suggestion the bus overrides with continueAll: %d acks, want 2", n)
		}
		// An unknown suggestion is still refused.
		w := bus.client(t, "bad-policy", "")
		if code, _ := w.callError(2, "subscribe", `{"topic":"policy:x","policy":"whenever"}`); code != -32602 {
			t.Errorf("unknown policy: %d, want -32602", code)
		}
	})

	t.Run("stopPropagationOnStop by default", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_POLICY": "stopPropagationOnStop",
			"CONCLAVE_BUS_CLIENT_POLICIES": "false"}), busOption{})
		first := bus.client(t, "stop-first", "")
		first.subscribe(2, "policy:stop", "continueAll")
		second := bus.client(t, "stop-second", "")
		if res := second.result(2, "subscribe", `{"topic":"policy:stop","policy":"continueAll"}`); res["policy"] != "stopPropagationOnStop" {
			t.Fatalf("policy %v", res["policy"])
		}
		pub := bus.client(t, "stop-pub", "")
		// processed without stopPropagation does not stop it...
		pub.publish(3, "policy:stop", `{"text":"x"}`)
		id, _ := second.expectRequest("sendMessage")
		second.reply(id, `{"processed":true}`)
		id, _ = first.expectRequest("sendMessage")
		first.reply(id, `{"processed":true}`)
		if res := testenv.At[map[string]any](t, pub.response(3), "result"); len(testenv.At[[]any](t, res, "acks")) != 2 || res["stopPropagation"] != false {
			t.Errorf("processed under stopPropagationOnStop: %v", res)
		}
		// ...stopPropagation does.
		pub.publish(4, "policy:stop", `{"text":"y"}`)
		id, _ = second.expectRequest("sendMessage")
		second.reply(id, `{"processed":false,"stopPropagation":true}`)
		if res := testenv.At[map[string]any](t, pub.response(4), "result"); len(testenv.At[[]any](t, res, "acks")) != 1 || res["stopPropagation"] != true {
			t.Errorf("stopPropagation under stopPropagationOnStop: %v", res)
		}
		first.result(9, "ping", `{}`)
	})
}
