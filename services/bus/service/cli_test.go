package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/service"
)

func TestCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_RETRY_ATTEMPTS": "1",
		"CONCLAVE_BUS_RATE": "1000000", "CONCLAVE_BUS_BURST": "1000000"}), busOption{})
	env := map[string]string{"BUB_BUS_URL": bus.url, "BUB_AGENT_ID": "agent-cli", "BUB_DEFAULT_TOPIC": "cli:default"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	bub := func(stdin string, args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := service.CLI(context.Background(), "bub", args, lookup, strings.NewReader(stdin), &out, &errOut)
		if err != nil {
			return out.String(), err
		}
		return out.String(), nil
	}

	// subscribe prints each message as one JSON line.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- service.CLI(ctx, "bub", []string{"subscribe", "cli:*"}, lookup, strings.NewReader(""), pw, io.Discard)
		pw.Close()
	}()
	watcher := bus.client(t, "watcher", "")
	// The subscriber's lines, read as they come so it never blocks.
	printed := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			printed <- sc.Text()
		}
		close(printed)
	}()
	next := func() string { return <-printed }
	// Wait for the subscription: a probe publish reaches it once it
	// exists. Spaced out, to stay under the bus's rate limit (200 a
	// second) while the subscriber starts.
	testenv.Eventually(t, time.Minute, "a probe to reach the subscriber", func() bool {
		res := watcher.result(2, "sendMessage", `{"topic":"cli:probe","payload":{"type":"probe"}}`)
		return len(testenv.At[[]any](t, res, "acks")) > 0
	})
	if line := next(); !strings.Contains(line, `"topic":"cli:probe"`) {
		t.Fatalf("subscribe printed %q", line)
	}

	// send-message with inline, file and stdin payloads; one line each,
	// the result with its acks.
	file := filepath.Join(t.TempDir(), "task.json")
	if err := os.WriteFile(file, []byte(`{"type":"task_request","task_id":"from-file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"send-message", "--topic", "cli:inline", "--payload", `{"type":"x","n":1}`}, "", `"n":1`},
		{[]string{"send-message", "--topic", "cli:file", "--payload", "@" + file}, "", `"task_id":"from-file"`},
		{[]string{"send-message", "--payload", "-"}, `{"type":"x","via":"stdin"}`, `"topic":"cli:default"`},
	} {
		out, err := bub(tc.stdin, tc.args...)
		if err != nil {
			t.Fatalf("bub %v: %v", tc.args, err)
		}
		var res struct {
			Success bool `json:"success"`
			Acks    []struct {
				ClientID string `json:"client_id"`
			} `json:"acks"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil || !res.Success || len(res.Acks) != 1 || strings.Count(out, "\n") != 1 {
			t.Errorf("bub %v printed %q (%v)", tc.args, out, err)
		}
		if line := next(); !strings.Contains(line, tc.want) {
			t.Errorf("the subscriber printed %q, want %s", line, tc.want)
		}
	}
	if _, err := bub("", "send-message", "--topic", "cli:x", "--payload", "[1]"); err == nil {
		t.Error("a payload that is not an object was sent")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("subscribe ended with %v", err)
	}

	// dlq list, show, redrive: make a dead letter first.
	agent := bus.client(t, "agent-dlq", agentCaps)
	agent.subscribe(2, "dlq:x", "")
	pub := bus.client(t, "pub", "")
	pub.publish(3, "dlq:x", `{"type":"t"}`)
	id, _ := agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":false,"should_retry":true}`)
	pub.response(3)
	out, err := bub("", "dlq", "list")
	if err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("dlq list: %q %v", out, err)
	}
	var dl struct{ ID, Topic string }
	if err := json.Unmarshal([]byte(out), &dl); err != nil || dl.Topic != "dlq:x" {
		t.Fatalf("dlq list line %q: %v", out, err)
	}
	if out, err := bub("", "dlq", "show", dl.ID); err != nil || !strings.Contains(out, `"dlq:x"`) {
		t.Errorf("dlq show: %q %v", out, err)
	}
	if _, err := bub("", "dlq", "show", "nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("dlq show of an unknown id: %v", err)
	}
	if out, err := bub("", "dlq", "redrive", "--all"); err != nil || !strings.Contains(out, dl.ID) {
		t.Errorf("dlq redrive --all: %q %v", out, err)
	}
	id, _ = agent.expectRequest("processMessage")
	agent.reply(id, `{"processed":true}`)
}
