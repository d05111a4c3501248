package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestBusCommands runs `conclave bus ...` as a user does: `conclave bus
// serve` runs the bus (with the bus deployable's settings), and `conclave
// bus subscribe`, `send-message`, `dlq list` and `dlq show` talk to it.
func TestBusCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the conclave binary")
	}
	t.Parallel()
	serve := exec.Command(conclaveBin, "bus", "serve")
	serve.Env = append(os.Environ(), "CONCLAVE_DATA_DIR="+t.TempDir(), "CONCLAVE_BUS_ADDR=127.0.0.1:0",
		"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED=true", "OTEL_EXPORTER_OTLP_ENDPOINT=")
	starting, cancelStart := context.WithTimeout(t.Context(), time.Minute)
	defer cancelStart()
	server, err := testenv.StartCommand(starting, "conclave bus serve", serve)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.Kill)
	url := "ws://" + server.HTTPAddr
	bus := func(args ...string) *exec.Cmd {
		cmd := exec.Command(conclaveBin, append([]string{"bus"}, args...)...)
		cmd.Env = append(os.Environ(), "BUB_BUS_URL="+url, "BUB_AGENT_ID=conclave-bus-test")
		return cmd
	}

	sub := bus("subscribe", "cb:*")
	sub.Env = append(sub.Env, "BUB_AGENT_ID=conclave-bus-subscriber")
	lines := testenv.StartLines(t, sub)

	// send-message until the subscription is in place (its ack appears).
	testenv.EventuallyNoError(t, time.Minute, "the subscriber's ack", func() error {
		out, err := bus("send-message", "--topic", "cb:1", "--payload", `{"type":"plaintext_message","text":"hi"}`).Output()
		if err != nil {
			t.Fatalf("conclave bus send-message: %v: %s", err, out)
		}
		var res struct {
			Success bool `json:"success"`
			Acks    []struct {
				ClientID string `json:"client_id"`
			} `json:"acks"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("conclave bus send-message printed %q: %v", out, err)
		}
		if len(res.Acks) != 1 || res.Acks[0].ClientID != "conclave-bus-subscriber" || !res.Success {
			return fmt.Errorf("send-message printed %s", out)
		}
		return nil
	})
	if line := lines.Next(t, time.Minute, "the subscriber's message"); !strings.Contains(line, `"topic":"cb:1"`) {
		t.Fatalf("conclave bus subscribe printed %q", line)
	}

	// A dead letter to list and show: an agent that asks for a retry at
	// each of the bus's three attempts.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.CloseNow()
	call := func(frame string) {
		t.Helper()
		if err := agent.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
			t.Fatal(err)
		}
	}
	read := func() map[string]any {
		t.Helper()
		_, data, err := agent.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	call(`{"jsonrpc":"2.0","method":"initialize","params":{"clientId":"cb-agent","capabilities":{"processMessage":true}},"id":1}`)
	read()
	call(`{"jsonrpc":"2.0","method":"subscribe","params":{"topic":"agent:cb"},"id":2}`)
	read()
	send := bus("send-message", "--topic", "agent:cb", "--payload", `{"type":"task_request","task_id":"t-1"}`)
	done := make(chan error, 1)
	go func() { done <- send.Run() }()
	for attempt := 1; attempt <= 3; attempt++ {
		m := read()
		if m["method"] != "processMessage" {
			t.Fatalf("the agent got %v", m)
		}
		id, _ := json.Marshal(m["id"])
		call(fmt.Sprintf(`{"jsonrpc":"2.0","result":{"processed":false,"should_retry":true,"retry_seconds":1},"id":%s}`, id))
	}
	if err := <-done; err != nil {
		t.Fatalf("conclave bus send-message to the agent: %v", err)
	}
	var out []byte
	testenv.Eventually(t, time.Minute, "a dead letter in 'conclave bus dlq list'", func() bool {
		if out, err = bus("dlq", "list").Output(); err != nil {
			t.Fatalf("conclave bus dlq list: %v", err)
		}
		return len(out) > 0
	})
	var dl struct{ ID, Topic string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Topic != "agent:cb" || strings.Count(string(out), "\n") != 1 {
		t.Fatalf("conclave bus dlq list printed %q (%v)", out, err)
	}
	if out, err := bus("dlq", "show", dl.ID).Output(); err != nil || !strings.Contains(string(out), `"task_id":"t-1"`) {
		t.Errorf("conclave bus dlq show: %q %v", out, err)
	}

	// Interrupted, subscribe ends cleanly.
	if err := lines.Exit(t, time.Minute, syscall.SIGINT); err != nil {
		t.Errorf("conclave bus subscribe after SIGINT: %v", err)
	}
}
