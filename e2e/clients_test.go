package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// The scenario's clients: plain HTTP with JSON, Server-Sent Events, and the
// bus's JSON-RPC over WebSocket. Each call is made in the context it is
// given, whose span goes with it (traceparent, params._meta.traceparent).

// request builds an HTTP request with a JSON body (nil for none) and the
// bearer token ("" for none).
func request(ctx context.Context, method, url, token string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req, nil
}

// do makes a JSON call and decodes the answer into out (unless nil or the
// status is not 2xx); it fails the step when the call cannot be made. It
// returns the status and the body.
func (r *stepRun) do(ctx context.Context, method, url, token string, body, out any) (int, []byte) {
	r.t.Helper()
	req, err := request(ctx, method, url, token, body)
	if err != nil {
		r.t.Fatal(err)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			r.t.Fatalf("%s %s: %v in %s", method, url, err, data)
		}
	}
	return resp.StatusCode, data
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	name, data string
}

// readSSE reads a text/event-stream until it ends, and returns its events.
func readSSE(body io.Reader) ([]sseEvent, error) {
	var (
		out []sseEvent
		cur sseEvent
	)
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.name != "" || cur.data != "" {
				if cur.name == "" {
					cur.name = "message"
				}
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event:"):
			cur.name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			if cur.data != "" {
				cur.data += "\n"
			}
			cur.data += strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
		}
	}
	return out, sc.Err()
}

// delivery is a message the bus delivered to a test client: sendMessage to
// a base-protocol subscriber, processMessage to an agent.
type delivery struct {
	method    string
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	MessageID string          `json:"message_id"`
	Attempt   int             `json:"attempt"`
	// traceID is the trace the delivery came in (params._meta.traceparent).
	traceID string
}

// payload decodes the delivery's payload.
func (d delivery) payload() map[string]any {
	var m map[string]any
	_ = json.Unmarshal(d.Payload, &m)
	return m
}

// busClient is a test client of the bus, initialized.
type busClient struct {
	conn *jsonrpc.Conn
	// deliveries are what the bus delivered to it, in order.
	deliveries chan delivery
}

// dialBus connects to the bus as clientID with the shape's token and
// initializes, as an agent (processMessage) when agent is set. answer
// gives each delivery's answer; nil answers as a subscriber that took it
// ({success: true}, or {processed: true} for an agent). Every delivery
// also goes to deliveries. The connection closes when the step ends.
func (r *stepRun) dialBus(ctx context.Context, clientID string, agent bool, answer func(delivery) any) *busClient {
	r.t.Helper()
	opts := &websocket.DialOptions{HTTPHeader: http.Header{}}
	if r.sh.busToken != "" {
		opts.HTTPHeader.Set("Authorization", "Bearer "+r.sh.busToken)
	}
	ws, _, err := websocket.Dial(ctx, r.sh.busURL, opts)
	if err != nil {
		r.t.Fatalf("dial the bus at %s: %v", r.sh.busURL, err)
	}
	c := &busClient{deliveries: make(chan delivery, 256)}
	take := func(method string) func(ctx context.Context, req *jsonrpc.Request) (any, error) {
		return func(ctx context.Context, req *jsonrpc.Request) (any, error) {
			d := delivery{method: method}
			if err := req.DecodeParams(&d); err != nil {
				return nil, err
			}
			if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
				d.traceID = sc.TraceID().String()
			}
			c.deliveries <- d
			if answer != nil {
				return answer(d), nil
			}
			if agent {
				return map[string]any{"processed": true, "should_retry": false, "retry_seconds": 0}, nil
			}
			return map[string]any{"success": true}, nil
		}
	}
	c.conn = jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), jsonrpc.Methods{
		"sendMessage": take("sendMessage"), "processMessage": take("processMessage")})
	r.t.Cleanup(func() { _ = c.conn.Close() })
	params := map[string]any{"clientId": clientID, "clientInfo": map[string]string{"name": "conclave-e2e", "version": "1"}}
	if agent {
		params["capabilities"] = map[string]bool{"processMessage": true}
	}
	c.call(r, ctx, "initialize", params, nil)
	return c
}

// call makes a call and fails the step on an error.
func (c *busClient) call(r *stepRun, ctx context.Context, method string, params, result any) {
	r.t.Helper()
	if err := c.conn.Call(ctx, method, params, result); err != nil {
		r.t.Fatalf("bus %s %v: %v", method, params, err)
	}
}

// subscribe subscribes to a topic pattern.
func (c *busClient) subscribe(r *stepRun, ctx context.Context, pattern string) {
	r.t.Helper()
	c.call(r, ctx, "subscribe", map[string]string{"topic": pattern}, nil)
}

// sendResult is sendMessage's result.
type sendResult struct {
	Success bool `json:"success"`
	Acks    []struct {
		ClientID  string `json:"client_id"`
		Processed bool   `json:"processed"`
		Message   string `json:"message"`
	} `json:"acks"`
}

// send publishes payload on topic and returns the result with its acks.
func (c *busClient) send(r *stepRun, ctx context.Context, topic string, payload any) sendResult {
	r.t.Helper()
	var res sendResult
	c.call(r, ctx, "sendMessage", map[string]any{"topic": topic, "payload": payload}, &res)
	return res
}

// next waits for the next delivery that match accepts, skipping others,
// and fails the step if none comes before the step's time is up.
func (c *busClient) next(r *stepRun, what string, match func(delivery) bool) delivery {
	r.t.Helper()
	for {
		select {
		case d := <-c.deliveries:
			if match(d) {
				return d
			}
		case <-r.ctx.Done():
			r.t.Fatalf("waiting for %s: %v", what, r.ctx.Err())
		}
	}
}

// waitFor calls check until it returns "" and fails the step with what
// check last said if the step's time runs out first. It is for state that
// only polling shows (a status, a listing).
func (r *stepRun) waitFor(what string, check func() string) {
	r.t.Helper()
	last := ""
	start := time.Now()
	for {
		if last = check(); last == "" {
			if waited := time.Since(start); waited > time.Second {
				r.t.Logf("waited %s for %s", waited.Round(time.Millisecond), what)
			}
			return
		}
		select {
		case <-r.ctx.Done():
			r.t.Fatalf("waiting for %s: %v; last: %s", what, r.ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
