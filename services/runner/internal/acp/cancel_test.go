package acp

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// agentEnd is the agent's side of a client: what the client writes, line by
// line, and a writer for the agent's answers.
type agentEnd struct {
	lines chan map[string]any
	out   *io.PipeWriter
	// read lets the agent start reading.
	read chan struct{}
}

// newClientWithAgent starts an ACP client whose session is up, talking to
// the returned agent end over pipes.
func newClientWithAgent(t *testing.T) (*Client, *agentEnd) {
	t.Helper()
	toAgentR, toAgentW := io.Pipe()
	fromAgentR, fromAgentW := io.Pipe()
	c := New(fromAgentR, toAgentW, Options{Dialect: DialectACP})
	c.initialized.Store(true)
	c.sessionID = "s1"
	a := &agentEnd{lines: make(chan map[string]any, 16), out: fromAgentW, read: make(chan struct{})}
	go func() {
		<-a.read
		sc := bufio.NewScanner(toAgentR)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				a.lines <- m
			}
		}
		close(a.lines)
	}()
	t.Cleanup(func() { _ = c.Close(); _ = fromAgentW.Close(); _ = toAgentR.Close() })
	return c, a
}

// TestCancelBeforeThePromptIsWritten: a turn cancelled before its prompt
// was written ends cancelled, and the agent hears of neither.
func TestCancelBeforeThePromptIsWritten(t *testing.T) {
	t.Parallel()
	c, a := newClientWithAgent(t)
	close(a.read)
	c.BeginTurn()
	if err := c.Cancel(context.Background(), "changed my mind"); err != nil {
		t.Fatal(err)
	}
	turn, err := c.Prompt(context.Background(), "never sent", time.Minute)
	if err != nil || turn.StopReason != StopCancelled {
		t.Fatalf("turn %+v, %v; want cancelled", turn, err)
	}
	_ = c.Close()
	for m := range a.lines {
		t.Errorf("the agent was sent %v", m)
	}
}

// TestCancelFollowsItsPrompt: a cancel of a turn whose prompt is being
// written reaches the agent after the prompt, never before it.
func TestCancelFollowsItsPrompt(t *testing.T) {
	t.Parallel()
	c, a := newClientWithAgent(t)
	c.BeginTurn()
	turned := make(chan Turn, 1)
	go func() {
		turn, _ := c.Prompt(context.Background(), "work", time.Minute)
		turned <- turn
	}()
	// The agent is not reading, so the prompt's write stays in progress
	// (a pipe holds nothing): the cancel must wait for it.
	for writing := false; !writing; {
		c.mu.Lock()
		writing = c.turn != nil && c.turn.writing
		c.mu.Unlock()
	}
	cancelled := make(chan error, 1)
	go func() { cancelled <- c.Cancel(context.Background(), "stop") }()
	select {
	case err := <-cancelled:
		t.Fatalf("the cancel returned (%v) before its prompt was written", err)
	default:
	}
	close(a.read)
	first := <-a.lines
	if first["method"] != "session/prompt" {
		t.Fatalf("the agent first got %v, want session/prompt", first)
	}
	second := <-a.lines
	if second["method"] != "session/cancel" {
		t.Fatalf("then %v, want session/cancel", second)
	}
	if err := <-cancelled; err != nil {
		t.Fatal(err)
	}
	answer, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": first["id"], "result": map[string]string{"stopReason": "cancelled"}})
	if _, err := a.out.Write(append(answer, '\n')); err != nil {
		t.Fatal(err)
	}
	if turn := <-turned; turn.StopReason != StopCancelled {
		t.Fatalf("turn %+v", turn)
	}
}

// TestCancelWithNoTurn does nothing.
func TestCancelWithNoTurn(t *testing.T) {
	t.Parallel()
	c, a := newClientWithAgent(t)
	close(a.read)
	if err := c.Cancel(context.Background(), "nothing to cancel"); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	for m := range a.lines {
		t.Errorf("the agent was sent %v", m)
	}
}
