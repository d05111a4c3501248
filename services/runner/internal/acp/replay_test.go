package acp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// TestReplayAfterTheLoadAnswer: an agent that answers session/load first
// and streams the session's history after (Gemini CLI does) has every
// update it sends until the next prompt taken as replay, and the prompt's
// own updates not.
func TestReplayAfterTheLoadAnswer(t *testing.T) {
	t.Parallel()
	toAgentR, toAgentW := io.Pipe()
	fromAgentR, fromAgentW := io.Pipe()
	var r recorder
	c := New(fromAgentR, toAgentW, r.opts(DialectACP))
	c.initialized.Store(true)
	t.Cleanup(func() { _ = c.Close(); _ = fromAgentW.Close(); _ = toAgentR.Close() })
	requests := make(chan map[string]any, 4)
	go func() {
		sc := bufio.NewScanner(toAgentR)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				requests <- m
			}
		}
		close(requests)
	}()
	write := func(s string) {
		if _, err := io.WriteString(fromAgentW, s+"\n"); err != nil {
			t.Error(err)
		}
	}
	chunk := func(kind, text string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":%q,"content":{"type":"text","text":%q}}}}`, kind, text)
	}
	next := func(method string) map[string]any {
		t.Helper()
		select {
		case m := <-requests:
			if m["method"] != method {
				t.Fatalf("the agent got %v, want %s", m, method)
			}
			return m
		case <-time.After(time.Minute):
			t.Fatalf("the agent got no %s within a minute", method)
		}
		return nil
	}

	loaded := make(chan error, 1)
	go func() { loaded <- c.LoadSession(context.Background(), "/w", "s1") }()
	load := next("session/load")
	write(fmt.Sprintf(`{"jsonrpc":"2.0","id":%v,"result":{}}`, load["id"]))
	// The history, after the answer, spread out as an agent reading it
	// from disk sends it.
	write(chunk("user_message_chunk", "an earlier prompt"))
	time.Sleep(20 * time.Millisecond)
	write(chunk("agent_message_chunk", "an earlier answer"))
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	// Still before the next prompt: the agent's commands, say.
	write(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"init"}]}}}`)
	// Received before the prompt is written.
	testenv.EventuallyNoError(t, time.Minute, "the client to read the 3 updates before the prompt", func() error {
		r.mu.Lock()
		n := len(r.updates)
		r.mu.Unlock()
		if n != 3 {
			return fmt.Errorf("%d read", n)
		}
		return nil
	})

	turned := make(chan Turn, 1)
	go func() {
		turn, err := c.Prompt(context.Background(), "now", time.Minute)
		if err != nil {
			t.Error(err)
		}
		turned <- turn
	}()
	prompt := next("session/prompt")
	write(chunk("agent_message_chunk", "the new answer"))
	write(fmt.Sprintf(`{"jsonrpc":"2.0","id":%v,"result":{"stopReason":"end_turn"}}`, prompt["id"]))
	if turn := <-turned; turn.StopReason != StopEndTurn {
		t.Fatalf("turn %+v", turn)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	var got []string
	for _, u := range r.updates {
		got = append(got, fmt.Sprintf("%s %q replay=%t", u.Kind, u.Text, u.Replay))
	}
	want := []string{
		`user_message_chunk "an earlier prompt" replay=true`,
		`content "an earlier answer" replay=true`,
		`available_commands_update "init" replay=true`,
		`content "the new answer" replay=false`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("updates:\n%s\nwant:\n%s", got, want)
	}
}
