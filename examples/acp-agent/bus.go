package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// busAgent is the agent's bus side (-bus), for an agent the bus's default
// handler has the runner launch: the runner drives it over ACP on stdio as
// any agent, and it also joins the bus as the bub protocol's agents do. It dials
// BUB_BUS_URL with BUB_TOKEN as its bearer token, initializes as
// BUB_AGENT_ID with the processMessage capability, subscribes to
// BUB_DEFAULT_TOPIC, and answers each processMessage: it publishes a reply
// on agent:{BUB_AGENT_ID}, then acknowledges the message with the same text.
//
// The reply's payload has no type, as the base protocol's messages have
// none: a base-protocol subscriber of agent:* receives it, and when nobody
// subscribes the bus refuses it rather than having the default handler
// launch another agent for it. The reply carries the delivery's trace
// context (params._meta.traceparent), so it stays in the publisher's trace.
type busAgent struct {
	id, topic string
	ws        *websocket.Conn
	ctx       context.Context

	wmu     sync.Mutex
	mu      sync.Mutex
	nextID  int
	pending map[string]chan message
}

// joinBus runs the bus side until the bus closes the connection; it
// returns at once when BUB_BUS_URL is not set.
func joinBus(ctx context.Context) error {
	url, id, topic := os.Getenv("BUB_BUS_URL"), os.Getenv("BUB_AGENT_ID"), os.Getenv("BUB_DEFAULT_TOPIC")
	if url == "" {
		return nil
	}
	if id == "" || topic == "" {
		return errors.New("BUB_BUS_URL is set without BUB_AGENT_ID and BUB_DEFAULT_TOPIC")
	}
	header := http.Header{}
	if token := os.Getenv("BUB_TOKEN"); token != "" {
		header.Set("Authorization", "Bearer "+token)
	}
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		return fmt.Errorf("dial %s: %w", url, err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(4 << 20)
	b := &busAgent{id: id, topic: topic, ws: ws, ctx: ctx, pending: map[string]chan message{}}
	read := make(chan error, 1)
	go func() { read <- b.readLoop() }()
	for _, c := range []struct {
		method string
		params any
	}{
		{"initialize", map[string]any{"clientId": id, "clientInfo": map[string]string{"name": "conclave-acp-agent", "version": "1.0.0"},
			"capabilities": map[string]bool{"processMessage": true}}},
		{"subscribe", map[string]string{"topic": topic}},
	} {
		res, err := b.call(c.method, c.params)
		if err != nil {
			return fmt.Errorf("%s: %w", c.method, err)
		}
		if res.Error != nil {
			return fmt.Errorf("%s: the bus answered %s", c.method, res.Error)
		}
	}
	fmt.Fprintf(os.Stderr, "acp-agent: bus: %s subscribed to %s at %s\n", id, topic, url)
	return <-read
}

// readLoop routes answers to their calls and handles the bus's requests,
// each on its own goroutine (an answer to our own sendMessage may only come
// once a processMessage is answered).
func (b *busAgent) readLoop() error {
	for {
		_, data, err := b.ws.Read(b.ctx)
		if err != nil {
			return err
		}
		var m message
		if err := json.Unmarshal(data, &m); err != nil {
			fmt.Fprintln(os.Stderr, "acp-agent: bus: bad frame:", err)
			continue
		}
		switch {
		case m.Method == "" && m.ID != nil:
			b.mu.Lock()
			ch := b.pending[string(m.ID)]
			delete(b.pending, string(m.ID))
			b.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case m.Method == "processMessage" && m.ID != nil:
			go b.processMessage(m)
		case m.ID != nil:
			b.write(map[string]any{"jsonrpc": "2.0", "id": m.ID, "error": map[string]any{"code": -32601, "message": "Method not found: " + m.Method}})
		}
	}
}

func (b *busAgent) write(v any) error {
	data, _ := json.Marshal(v)
	b.wmu.Lock()
	defer b.wmu.Unlock()
	return b.ws.Write(b.ctx, websocket.MessageText, data)
}

// call sends a request to the bus and waits for its answer.
func (b *busAgent) call(method string, params any) (message, error) {
	b.mu.Lock()
	b.nextID++
	id := strconv.Itoa(b.nextID)
	ch := make(chan message, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	if err := b.write(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(id), "method": method, "params": params}); err != nil {
		return message{}, err
	}
	select {
	case m := <-ch:
		return m, nil
	case <-b.ctx.Done():
		return message{}, b.ctx.Err()
	}
}

// processMessage replies to a delivery on agent:{id} and acknowledges it.
func (b *busAgent) processMessage(m message) {
	var p struct {
		Topic     string `json:"topic"`
		MessageID string `json:"message_id"`
		Attempt   int    `json:"attempt"`
		Payload   struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"payload"`
		Meta struct {
			Traceparent string `json:"traceparent"`
		} `json:"_meta"`
	}
	_ = json.Unmarshal(m.Params, &p)
	fmt.Fprintf(os.Stderr, "acp-agent: bus: processMessage %s on %s (attempt %d, traceparent %s)\n", p.MessageID, p.Topic, p.Attempt, p.Meta.Traceparent)
	text := fmt.Sprintf("%s processed %s message %q", b.id, p.Payload.Type, p.Payload.Text)
	reply := map[string]any{"topic": "agent:" + b.id, "payload": map[string]any{"from": b.id, "in_reply_to": p.MessageID, "text": text}}
	if p.Meta.Traceparent != "" {
		// The agent makes no spans of its own: its reply is a child of
		// the delivery's span.
		reply["_meta"] = map[string]any{"traceparent": p.Meta.Traceparent}
	}
	res, err := b.call("sendMessage", reply)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "acp-agent: bus: reply:", err)
	case res.Error != nil:
		fmt.Fprintf(os.Stderr, "acp-agent: bus: reply refused: %s\n", res.Error)
	}
	answer := map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": map[string]any{"processed": true, "should_retry": false, "retry_seconds": 0, "message": text}}
	if err := b.write(answer); err != nil {
		fmt.Fprintln(os.Stderr, "acp-agent: bus: answer:", err)
	}
}
