package service_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestBubBinary runs the bub command line as a user does: `bub serve` runs
// the bus, and `bub subscribe`, `bub send-message` and `bub dlq list` talk
// to it, each a process of its own reading BUB_BUS_URL, BUB_AGENT_ID and
// BUB_DEFAULT_TOPIC.
func TestBubBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: runs bub as processes")
	}
	t.Parallel()
	url := "ws://" + serveProcess(t, exec.Command(bubBinary, "serve"), t.TempDir(), "127.0.0.1:0").HTTPAddr
	bub := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bubBinary, args...)
		cmd.Env = append(os.Environ(), "BUB_BUS_URL="+url, "BUB_AGENT_ID=bub-test", "BUB_DEFAULT_TOPIC=bub:default")
		return cmd
	}

	sub := bub("subscribe", "bub:*")
	sub.Env = append(sub.Env, "BUB_AGENT_ID=bub-subscriber")
	lines := testenv.StartLines(t, sub)

	// Wait for its subscription: a probe reaches it once it exists. The
	// probes are spaced out, to stay under the bus's rate limit (200 a
	// second) while the subscriber starts.
	probe := dial(t, url, nil)
	probe.initialize("probe", "")
	i := 1
	testenv.Eventually(t, time.Minute, "a probe to reach the subscriber", func() bool {
		i++
		res := probe.result(i, "sendMessage", `{"topic":"bub:probe","payload":{"type":"probe"}}`)
		return len(testenv.At[[]any](t, res, "acks")) > 0
	})
	if line := lines.Next(t, time.Minute, "the subscriber's probe"); !strings.Contains(line, `"topic":"bub:probe"`) {
		t.Fatalf("bub subscribe printed %q", line)
	}

	// send-message to the default topic, the payload on stdin.
	send := bub("send-message", "--payload", "-")
	send.Stdin = strings.NewReader(`{"type":"plaintext_message","text":"from a process"}`)
	out, err := send.Output()
	if err != nil {
		t.Fatalf("bub send-message: %v: %s", err, out)
	}
	var res struct {
		Success bool `json:"success"`
		Acks    []struct {
			ClientID  string `json:"client_id"`
			Processed bool   `json:"processed"`
		} `json:"acks"`
	}
	if err := json.Unmarshal(out, &res); err != nil || !res.Success || len(res.Acks) != 1 ||
		res.Acks[0].ClientID != "bub-subscriber" || !res.Acks[0].Processed || strings.Count(string(out), "\n") != 1 {
		t.Errorf("bub send-message printed %q (%v)", out, err)
	}
	if line := lines.Next(t, time.Minute, "the message from a process"); !strings.Contains(line, `"topic":"bub:default"`) || !strings.Contains(line, "from a process") {
		t.Errorf("bub subscribe printed %q", line)
	}

	if out, err := bub("dlq", "list").Output(); err != nil || len(out) != 0 {
		t.Errorf("bub dlq list on an empty table: %q %v", out, err)
	}
	if out, err := bub("send-message", "--topic", "bub:x", "--payload", "[1]").CombinedOutput(); err == nil || !strings.Contains(string(out), "not a JSON object") {
		t.Errorf("bub send-message with a payload that is not an object: %q %v", out, err)
	}

	// Interrupted, subscribe ends cleanly.
	if err := lines.Exit(t, time.Minute, syscall.SIGINT); err != nil {
		t.Errorf("bub subscribe after SIGINT: %v", err)
	}
}
