package backend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// Bus is the bus: JSON-RPC over WebSocket for watching and publishing, and
// its dead-letter API over HTTP on the same listener, as `bub` reaches them.
type Bus struct {
	*Client
	// WebSocketURL is the bus's ws:// (or wss://) URL.
	WebSocketURL func() string
	// MaxFrameBytes bounds what one message from the bus may be.
	MaxFrameBytes int64
}

// HTTPBase turns the bus's WebSocket URL into the base of its HTTP API, as
// bub does.
func HTTPBase(wsURL string) string {
	u, err := url.Parse(wsURL)
	if err != nil || u.Host == "" {
		return ""
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	}
	u.Path, u.RawQuery = "", ""
	return strings.TrimSuffix(u.String(), "/")
}

// DeadLetter is a message the bus gave up delivering.
type DeadLetter struct {
	ID          string          `json:"id"`
	MessageID   string          `json:"message_id"`
	Topic       string          `json:"topic"`
	Payload     json.RawMessage `json:"payload"`
	ClientID    string          `json:"client_id,omitempty"`
	Publisher   string          `json:"publisher,omitempty"`
	Attempts    int             `json:"attempts"`
	LastError   string          `json:"last_error"`
	PublishedAt time.Time       `json:"published_at"`
	DeadAt      time.Time       `json:"dead_at"`
}

// DeadLetters lists one page of dead letters, oldest first.
func (b Bus) DeadLetters(ctx context.Context, token, cursor string, limit int) ([]DeadLetter, string, error) {
	var page struct {
		DeadLetters []DeadLetter `json:"dead_letters"`
		Cursor      string       `json:"cursor"`
	}
	err := b.Do(ctx, token, "GET", fmt.Sprintf("/v1/dead-letters?limit=%d&cursor=%s", limit, url.QueryEscape(cursor)), nil, &page)
	return page.DeadLetters, page.Cursor, err
}

// DeadLetter shows one dead letter.
func (b Bus) DeadLetter(ctx context.Context, token, id string) (DeadLetter, error) {
	var dl DeadLetter
	err := b.Do(ctx, token, "GET", "/v1/dead-letters/"+url.PathEscape(id), nil, &dl)
	return dl, err
}

// Redrive puts one dead letter (or, with id "", every one) back on the
// retry queue.
func (b Bus) Redrive(ctx context.Context, token, id string) error {
	path := "/v1/dead-letters/redrive"
	if id != "" {
		path = "/v1/dead-letters/" + url.PathEscape(id) + "/redrive"
	}
	var out json.RawMessage
	return b.Do(ctx, token, "POST", path, nil, &out)
}

// Message is one message the bus delivered to a watcher.
type Message struct {
	Topic   string          `json:"topic"`
	Payload json.RawMessage `json:"payload"`
	// MessageID and Attempt are set on agent deliveries only.
	MessageID string    `json:"message_id,omitempty"`
	TraceID   string    `json:"trace_id,omitempty"`
	Received  time.Time `json:"received"`
}

// Ack is one subscriber's answer to a published message.
type Ack struct {
	ClientID  string `json:"client_id"`
	Processed bool   `json:"processed"`
	Message   string `json:"message"`
}

// PublishResult is the bus's answer to sendMessage.
type PublishResult struct {
	Success         bool   `json:"success"`
	StopPropagation bool   `json:"stopPropagation"`
	Acks            []Ack  `json:"acks"`
	TraceID         string `json:"trace_id,omitempty"`
}

// WatchAck is what the console answers each delivery with: it looks and
// does not process, so propagation continues to the other subscribers.
var WatchAck = map[string]any{"success": true, "processed": false, "stopPropagation": false, "message": "seen by the console's topic viewer"}

// connect dials the bus and initializes as clientID.
func (b Bus) connect(ctx context.Context, token, clientID string, handler jsonrpc.Handler) (*jsonrpc.Conn, error) {
	wsURL := b.WebSocketURL()
	if wsURL == "" {
		b.observe("unavailable")
		return nil, &Error{Service: "bus", Kind: Unavailable, Message: "its address is not known yet"}
	}
	header := http.Header{}
	if token != "" {
		header.Set("Authorization", "Bearer "+token)
	}
	dctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, wsURL, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			b.observe("unauthorized")
			return nil, &Error{Service: "bus", Kind: Unauthorized, Status: resp.StatusCode, Message: "the bus refused the token", Err: err}
		}
		b.observe("unavailable")
		return nil, &Error{Service: "bus", Kind: Unavailable, Message: cleanNetError(err), Err: err}
	}
	conn := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, int(b.MaxFrameBytes)), handler)
	if err := conn.Call(dctx, "initialize", map[string]any{
		"clientId":   clientID,
		"clientInfo": map[string]string{"name": "conclave-console", "version": "0.1.0"},
	}, nil); err != nil {
		conn.Close()
		return nil, b.rpcError("initialize", err)
	}
	b.observe("ok")
	return conn, nil
}

// rpcError classifies a JSON-RPC error from the bus.
func (b Bus) rpcError(method string, err error) error {
	if rpc, ok := errors.AsType[*jsonrpc.Error](err); ok {
		kind := Rejected
		if rpc.Code == -32005 {
			kind = Unauthorized
		}
		return &Error{Service: "bus", Kind: kind, Status: 200, Message: fmt.Sprintf("%s: %s (%d)", method, rpc.Message, rpc.Code), Err: err}
	}
	return &Error{Service: "bus", Kind: Unavailable, Message: method + ": " + err.Error(), Err: err}
}

// ClientID makes a bus client id for the console's connections.
func ClientID(purpose string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "console-" + purpose + "-" + hex.EncodeToString(b)
}

// Watch subscribes to pattern and calls onMessage for each message until
// ctx ends or the bus closes the connection. onSubscribed is called once
// the subscription holds. onMessage must not block: the bus waits for the
// console's answer before it moves on to the next subscriber.
func (b Bus) Watch(ctx context.Context, token, pattern string, onSubscribed func(), onMessage func(Message)) error {
	deliver := func(ctx context.Context, req *jsonrpc.Request) (any, error) {
		var m Message
		if err := req.DecodeParams(&m); err != nil {
			return nil, err
		}
		m.Received = time.Now().UTC()
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			m.TraceID = sc.TraceID().String()
		}
		onMessage(m)
		return WatchAck, nil
	}
	conn, err := b.connect(ctx, token, ClientID("watch"), jsonrpc.Methods{"sendMessage": deliver, "processMessage": deliver})
	if err != nil {
		return err
	}
	defer conn.Close()
	sctx, cancel := context.WithTimeout(ctx, b.Timeout)
	err = conn.Call(sctx, "subscribe", map[string]string{"topic": pattern, "policy": "continueAll"}, nil)
	cancel()
	if err != nil {
		return b.rpcError("subscribe", err)
	}
	onSubscribed()
	select {
	case <-ctx.Done():
		return nil
	case <-conn.Done():
		return &Error{Service: "bus", Kind: Unavailable, Message: "the bus closed the connection", Err: conn.Err()}
	}
}

// Publish sends a message and returns the subscribers' acks.
func (b Bus) Publish(ctx context.Context, token, topic string, payload json.RawMessage) (PublishResult, error) {
	ctx, traceID := WithTrace(ctx)
	conn, err := b.connect(ctx, token, ClientID("publish"), nil)
	if err != nil {
		return PublishResult{}, err
	}
	defer conn.Close()
	// The bus waits for every subscriber's ack, each bounded by its
	// delivery timeout; give it that long and a little more.
	cctx, cancel := context.WithTimeout(ctx, b.Timeout+30*time.Second)
	defer cancel()
	var res PublishResult
	if err := conn.Call(cctx, "sendMessage", map[string]any{"topic": topic, "payload": payload}, &res); err != nil {
		return PublishResult{}, b.rpcError("sendMessage", err)
	}
	res.TraceID = traceID
	return res, nil
}
