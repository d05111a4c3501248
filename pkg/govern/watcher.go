package govern

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// DecisionTopics is the bus pattern the Librarian's request events are
// published on (its envelopes' type under system:).
const DecisionTopics = "system:librarian.request.*"

// Decision is how the Librarian decided a request.
type Decision struct {
	RequestID string
	// Status is approved, rejected, clarification_needed or completed.
	Status   string
	Response *librarianv1.LibrarianResponse
	// Via is "bus" (a decision event) or "status" (read once with GET
	// /agent/status, after a reconnect or a restart).
	Via string
	// Event is the span context the decision event came in, for a link.
	Event trace.SpanContext
}

// decided reports whether status is a final decision.
func decided(status string) bool {
	switch status {
	case "approved", "rejected", "clarification_needed", "completed":
		return true
	}
	return false
}

// WatcherOptions configure a Watcher.
type WatcherOptions struct {
	// URL is the bus's WebSocket URL (ws:// or wss://), a func so that a
	// process that starts the bus itself can give it once it listens.
	URL func() string
	// Token is presented in the upgrade's Authorization header; its grant
	// must allow subscribing to DecisionTopics.
	Token string
	// ClientID names the connection on the bus; it must be unique per
	// process (each replica subscribes for itself).
	ClientID string
	// Status reads a request's status once (Client.Status): after every
	// (re)subscription, for each request waited on, a decision missed
	// while the connection was down is found this way.
	Status func(ctx context.Context, id, agentID string) (*librarianv1.RequestStatus, error)
	Logger *slog.Logger
	// MaxFrameBytes bounds one message from the bus (default 1 MiB).
	MaxFrameBytes int
	// Ping is how often an idle connection is checked (default 30 s): a
	// connection whose ping is not answered within it is dropped and
	// dialled again.
	Ping time.Duration
	// BackoffMin and BackoffMax bound the pause between reconnections
	// (doubling, with jitter; default 200 ms to 5 s).
	BackoffMin, BackoffMax time.Duration
}

// Watcher hears the Librarian's decisions on the bus and hands each to
// whoever waits for that request. It keeps the latest decisions it heard
// for a while, so that a decision that comes before its waiter registers
// (the request was decided as it was submitted) is not missed.
type Watcher struct {
	o         WatcherOptions
	connected atomic.Bool

	mu      sync.Mutex
	waiters map[string]map[*Watch]struct{}
	// agents names the agent of each request waited on, whose token
	// reads its status.
	agents map[string]string
	recent map[string]Decision
	order  []string
}

// recentDecisions bounds the decisions kept for waiters yet to come.
const recentDecisions = 4096

// NewWatcher returns a watcher; Run connects it.
func NewWatcher(o WatcherOptions) *Watcher {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = 1 << 20
	}
	if o.Ping <= 0 {
		o.Ping = 30 * time.Second
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = 200 * time.Millisecond
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = max(5*time.Second, o.BackoffMin)
	}
	return &Watcher{o: o, waiters: map[string]map[*Watch]struct{}{}, agents: map[string]string{}, recent: map[string]Decision{}}
}

// Connected reports whether the watcher is subscribed now.
func (w *Watcher) Connected() bool { return w.connected.Load() }

// Watch is one waiter's registration for a request's decision.
type Watch struct {
	w  *Watcher
	id string
	// C receives the decision, once.
	C    <-chan Decision
	c    chan Decision
	once sync.Once
}

// Watch registers for the decision of request id, agentID's. A decision
// heard already is delivered at once. Stop ends the registration.
func (w *Watcher) Watch(id, agentID string) *Watch {
	c := make(chan Decision, 1)
	wt := &Watch{w: w, id: id, C: c, c: c}
	w.mu.Lock()
	defer w.mu.Unlock()
	if d, ok := w.recent[id]; ok {
		c <- d
		return wt
	}
	if w.waiters[id] == nil {
		w.waiters[id] = map[*Watch]struct{}{}
	}
	w.agents[id] = agentID
	w.waiters[id][wt] = struct{}{}
	return wt
}

// Stop ends the registration; it is safe to call more than once.
func (wt *Watch) Stop() {
	wt.once.Do(func() {
		wt.w.mu.Lock()
		defer wt.w.mu.Unlock()
		if set := wt.w.waiters[wt.id]; set != nil {
			delete(set, wt)
			if len(set) == 0 {
				delete(wt.w.waiters, wt.id)
				delete(wt.w.agents, wt.id)
			}
		}
	})
}

// deliver hands d to the request's waiters and keeps it for later ones.
func (w *Watcher) deliver(d Decision) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, seen := w.recent[d.RequestID]; !seen {
		w.order = append(w.order, d.RequestID)
		if len(w.order) > recentDecisions {
			delete(w.recent, w.order[0])
			w.order = w.order[1:]
		}
	}
	w.recent[d.RequestID] = d
	for wt := range w.waiters[d.RequestID] {
		select {
		case wt.c <- d:
		default:
		}
	}
	delete(w.waiters, d.RequestID)
	delete(w.agents, d.RequestID)
}

// Check reads request id's status once, as agentID, and delivers it if it
// is decided.
func (w *Watcher) Check(ctx context.Context, id, agentID string) {
	if w.o.Status == nil {
		return
	}
	st, err := w.o.Status(ctx, id, agentID)
	if err != nil {
		w.o.Logger.WarnContext(ctx, "govern: reading a request's status", "request_id", id, "error", err)
		return
	}
	if decided(st.GetStatus()) {
		w.deliver(Decision{RequestID: id, Status: st.GetStatus(), Response: st.GetResponse(), Via: "status"})
	}
}

// checkAll reads once the status of every request waited on.
func (w *Watcher) checkAll(ctx context.Context) {
	w.mu.Lock()
	agents := make(map[string]string, len(w.agents))
	for id, agent := range w.agents {
		agents[id] = agent
	}
	w.mu.Unlock()
	for id, agent := range agents {
		if ctx.Err() != nil {
			return
		}
		w.Check(ctx, id, agent)
	}
}

// Run keeps the watcher subscribed until ctx ends, dialling again (with
// backoff) whenever the connection drops; after each subscription it reads
// once the status of every request waited on, for the decisions made while
// it was not listening.
func (w *Watcher) Run(ctx context.Context) error {
	pause := w.o.BackoffMin
	for ctx.Err() == nil {
		start := time.Now()
		err := w.session(ctx)
		w.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > w.o.BackoffMax {
			pause = w.o.BackoffMin
		}
		w.o.Logger.WarnContext(ctx, "govern: not subscribed to the Librarian's decisions on the bus; retrying", "error", err, "in", pause)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause/2 + rand.N(pause/2+1)):
		}
		pause = min(pause*2, w.o.BackoffMax)
	}
	return nil
}

// session is one connection: dial, initialize, subscribe, then listen
// until it drops.
func (w *Watcher) session(ctx context.Context) error {
	u := w.o.URL()
	if u == "" {
		return errors.New("the bus's address is not known yet")
	}
	header := http.Header{}
	if w.o.Token != "" {
		header.Set("Authorization", "Bearer "+w.o.Token)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPHeader: header})
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		return fmt.Errorf("dialling %s: %w", u, err)
	}
	conn := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, w.o.MaxFrameBytes), jsonrpc.Methods{
		"sendMessage": w.handleDelivery, "processMessage": w.handleDelivery,
	}, jsonrpc.WithLogger(w.o.Logger))
	defer conn.Close()
	if err := conn.Call(dctx, "initialize", map[string]any{
		"clientId": w.o.ClientID, "clientInfo": map[string]string{"name": "conclave-govern", "version": "1"},
	}, nil); err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	if err := conn.Call(dctx, "subscribe", map[string]string{"topic": DecisionTopics, "policy": "continueAll"}, nil); err != nil {
		return fmt.Errorf("subscribe %s: %w", DecisionTopics, err)
	}
	cancel()
	w.connected.Store(true)
	w.o.Logger.InfoContext(ctx, "govern: subscribed to the Librarian's decisions on the bus", "topics", DecisionTopics, "client_id", w.o.ClientID)
	checked := make(chan struct{})
	go func() { defer close(checked); w.checkAll(ctx) }()
	defer func() { <-checked }()
	tick := time.NewTicker(w.o.Ping)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-conn.Done():
			return fmt.Errorf("the bus closed the connection: %w", conn.Err())
		case <-tick.C:
			pctx, cancel := context.WithTimeout(ctx, w.o.Ping)
			err := conn.Call(pctx, "ping", map[string]any{}, nil)
			cancel()
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("ping: %w", err)
			}
		}
	}
}

// watchAck is the answer to each delivery: seen, not processed, so that
// propagation goes on to every other subscriber (each runner replica,
// the bridge, the console).
var watchAck = map[string]any{"success": true, "processed": false, "stopPropagation": false}

// eventPayload is what the bus publishes for an envelope of bus-events.
type eventPayload struct {
	Type       string            `json:"type"`
	EventID    string            `json:"event_id"`
	SubjectIDs map[string]string `json:"subject_ids"`
	Data       json.RawMessage   `json:"data"`
}

func (w *Watcher) handleDelivery(ctx context.Context, req *jsonrpc.Request) (any, error) {
	var msg struct {
		Topic   string       `json:"topic"`
		Payload eventPayload `json:"payload"`
	}
	if err := req.DecodeParams(&msg); err != nil {
		return watchAck, nil
	}
	var st librarianv1.RequestStatus
	if len(msg.Payload.Data) == 0 || unmarshal.Unmarshal(msg.Payload.Data, &st) != nil {
		return watchAck, nil
	}
	id := st.GetRequestId()
	if id == "" {
		id = msg.Payload.SubjectIDs["request_id"]
	}
	if id == "" || !decided(st.GetStatus()) {
		return watchAck, nil
	}
	w.deliver(Decision{RequestID: id, Status: st.GetStatus(), Response: st.GetResponse(), Via: "bus",
		Event: trace.SpanContextFromContext(ctx)})
	return watchAck, nil
}
