package service_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

const agentCaps = `,"capabilities":{"processMessage":true}`

// getJSON fetches url into v and returns the status.
func getJSON(t *testing.T, method, url string, v any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if method != "GET" {
		// An open bus wants even an empty POST declared JSON.
		req.Header.Set("Content-Type", "application/json")
	}
	resp, body := testenv.Do(t, req)
	if v != nil {
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("%s %s: %s: %v", method, url, body, err)
		}
	}
	return resp.StatusCode
}

type deadLetters struct {
	DeadLetters []struct {
		ID        string          `json:"id"`
		Topic     string          `json:"topic"`
		Payload   json.RawMessage `json:"payload"`
		ClientID  string          `json:"client_id"`
		Attempts  int             `json:"attempts"`
		LastError string          `json:"last_error"`
	} `json:"dead_letters"`
}

func TestExtendedProtocol(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()

	t.Run("default topic", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		bridge := bus.client(t, "bridge", "")
		bridge.subscribe(2, "tg:*", "")
		agent := bus.client(t, "agent-abc123", `,"defaultTopic":"tg:123456789"`)
		agent.send(`{"jsonrpc":"2.0","method":"sendMessage","params":{"payload":{"type":"plaintext_message","text":"hi"}},"id":3}`)
		id, params := bridge.expectRequest("sendMessage")
		if params["topic"] != "tg:123456789" {
			t.Errorf("default topic delivery went to %v", params["topic"])
		}
		bridge.reply(id, `{"success":true}`)
		if res := testenv.At[map[string]any](t, agent.response(3), "result"); res["success"] != true {
			t.Errorf("result %v", res)
		}
	})

	t.Run("retry then dead letter then redrive", func(t *testing.T) {
		t.Parallel()
		cfg := defaultConfig(t, map[string]string{"CONCLAVE_BUS_RETRY_ATTEMPTS": "2"})
		bus := startBus(t, cfg, busOption{})
		agent := bus.client(t, "agent-flaky", agentCaps)
		agent.subscribe(2, "agent:flaky", "")
		pub := bus.client(t, "pub", "")
		pub.publish(3, "agent:flaky", `{"type":"task_request","task_id":"t-1"}`)

		id, params := agent.expectRequest("processMessage")
		if params["attempt"] != float64(1) || params["message_id"] == "" {
			t.Errorf("first delivery params %v", params)
		}
		agent.reply(id, `{"processed":false,"should_retry":true,"retry_seconds":1,"message":"busy"}`)
		ack := testenv.At[map[string]any](t, pub.response(3), "result", "acks", 0)
		if ack["processed"] != false || !contains(testenv.At[string](t, ack, "message"), "attempt 2 of 2 scheduled") {
			t.Errorf("ack after should_retry: %v", ack)
		}
		// The retry comes from the queue.
		id, params = agent.expectRequest("processMessage")
		if params["attempt"] != float64(2) || testenv.At[map[string]any](t, params, "payload")["task_id"] != "t-1" {
			t.Errorf("retry params %v", params)
		}
		agent.reply(id, `{"processed":false,"should_retry":true,"retry_seconds":1,"message":"still busy"}`)

		// Out of attempts: dead-lettered with payload, topic, attempts and
		// the last error. Ping to let the bus record it, then poll the API.
		var dl deadLetters
		for len(dl.DeadLetters) == 0 {
			agent.result(10, "ping", `{}`)
			getJSON(t, "GET", bus.http+"/v1/dead-letters", &dl)
		}
		got := dl.DeadLetters[0]
		if got.Topic != "agent:flaky" || got.ClientID != "agent-flaky" || got.Attempts != 2 ||
			!contains(got.LastError, "still busy") || !contains(string(got.Payload), `"task_id":"t-1"`) {
			t.Errorf("dead letter %+v", got)
		}
		var one map[string]any
		if status := getJSON(t, "GET", bus.http+"/v1/dead-letters/"+got.ID, &one); status != 200 || one["id"] != got.ID {
			t.Errorf("show: %d %v", status, one)
		}
		if status := getJSON(t, "GET", bus.http+"/v1/dead-letters/nope", nil); status != 404 {
			t.Errorf("show unknown: %d", status)
		}
		if status := getJSON(t, "POST", bus.http+"/v1/dead-letters/"+got.ID+"/redrive", nil); status != 200 {
			t.Fatalf("redrive: %d", status)
		}
		id, params = agent.expectRequest("processMessage")
		if params["attempt"] != float64(1) {
			t.Errorf("redriven delivery params %v", params)
		}
		agent.reply(id, `{"processed":true,"message":"done"}`)
		dl = deadLetters{}
		getJSON(t, "GET", bus.http+"/v1/dead-letters", &dl)
		if len(dl.DeadLetters) != 0 {
			t.Errorf("dead letters after redrive: %+v", dl)
		}
	})

	t.Run("disconnect mid-delivery is a failed attempt", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		agent := bus.client(t, "agent-crashy", agentCaps)
		agent.subscribe(2, "agent:crashy", "")
		pub := bus.client(t, "pub", "")
		pub.publish(3, "agent:crashy", `{"type":"task_request","task_id":"t-2"}`)
		agent.expectRequest("processMessage")
		_ = agent.c.CloseNow() // the agent crashes holding the message
		ack := testenv.At[map[string]any](t, pub.response(3), "result", "acks", 0)
		if !contains(testenv.At[string](t, ack, "message"), "disconnected") || !contains(testenv.At[string](t, ack, "message"), "attempt 2 of 3 scheduled") {
			t.Errorf("ack after a crash: %v", ack)
		}
		again := bus.client(t, "agent-crashy", agentCaps)
		again.subscribe(2, "agent:crashy", "")
		id, params := again.expectRequest("processMessage")
		if testenv.At[map[string]any](t, params, "payload")["task_id"] != "t-2" || params["attempt"] != float64(2) {
			t.Errorf("redelivery after reconnecting: %v", params)
		}
		again.reply(id, `{"processed":true}`)
	})

	t.Run("declined without retry is final", func(t *testing.T) {
		t.Parallel()
		bus := startBus(t, defaultConfig(t, nil), busOption{})
		agent := bus.client(t, "agent-picky", agentCaps)
		agent.subscribe(2, "agent:picky", "")
		pub := bus.client(t, "pub", "")
		pub.publish(3, "agent:picky", `{"type":"command","command":"x"}`)
		id, _ := agent.expectRequest("processMessage")
		agent.reply(id, `{"processed":false,"should_retry":false,"message":"not for me"}`)
		ack := testenv.At[map[string]any](t, pub.response(3), "result", "acks", 0)
		if ack["processed"] != false || ack["message"] != "not for me" {
			t.Errorf("ack %v", ack)
		}
		// Nothing more arrives: the next frame is the answer to a ping.
		agent.result(4, "ping", `{}`)
	})
}
