package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bus/service"
)

// guard bounds every wait on the bus, so that a broken bus fails a test
// instead of hanging it; it is not a performance expectation.
const guard = 30 * time.Second

// defaultConfig is the bus's configuration with every default applied, as
// an operator who sets nothing gets it, on a loopback port.
func defaultConfig(t testing.TB, env map[string]string) service.Config {
	t.Helper()
	var cfg struct{ Bus service.Config }
	lookup := func(k string) (string, bool) {
		if k == "CONCLAVE_BUS_ALLOW_UNAUTHENTICATED" {
			if _, ok := env["CONCLAVE_BUS_GRANTS"]; !ok {
				return "true", true
			}
		}
		if _, ok := env[k]; !ok && k == "CONCLAVE_BUS_ADDR" {
			return "127.0.0.1:0", true // an open bus binds loopback only
		}
		v, ok := env[k]
		return v, ok
	}
	if err := config.Load(context.Background(), &cfg, "bus", nil, lookup, io.Discard); err != nil {
		t.Fatal(err)
	}
	cfg.Bus.Addr = "127.0.0.1:0"
	cfg.Bus.ServerID = "bus-1"
	return cfg.Bus
}

// testBus is a running bus and what it runs on.
type testBus struct {
	*service.Bus
	url   string
	http  string
	st    store.Store
	queue queue.Queue
	// stop shuts the bus down and waits for Run to return; it runs again,
	// harmlessly, at the test's end.
	stop func()
}

type busOption struct {
	st       store.Store
	q        queue.Queue
	launcher service.Launcher
	tel      *telemetry.Provider
	logger   *slog.Logger
}

// startBus runs a real bus on a loopback port over an embedded store and
// queue of its own (or those given).
func startBus(t testing.TB, cfg service.Config, o busOption) *testBus {
	t.Helper()
	dir := t.TempDir()
	if o.st == nil {
		st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		o.st = st
	}
	if o.q == nil {
		q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = q.Close() })
		o.q = q
	}
	ctx := context.Background()
	if err := store.EnsureTables(ctx, o.st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	if err := queue.EnsureAll(ctx, o.q, service.Queues(service.Config{})...); err != nil {
		t.Fatal(err)
	}
	if o.tel == nil {
		tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "bus-test"})
		if err != nil {
			t.Fatal(err)
		}
		o.tel = tel
	}
	logger := slog.New(slog.DiscardHandler)
	if o.logger != nil {
		logger = o.logger
	} else if _, fuzz := t.(*testing.F); testing.Verbose() && !fuzz {
		// Not a fuzz test's: its bus outlives each input, and testing
		// panics when F.Log is called while an input runs.
		logger = slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	b, err := service.New(cfg, service.Deps{Store: o.st, Queue: o.q, Logger: logger, Telemetry: o.tel, Launcher: o.launcher})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(runCtx) }()
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("bus Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-b.Ready():
	case err := <-done:
		t.Fatalf("bus ended before it was ready: %v", err)
	}
	addr := b.Endpoints()[0].Address
	return &testBus{Bus: b, url: "ws://" + addr, http: "http://" + addr, st: o.st, queue: o.q, stop: stop}
}

// wire is a client written from the protocol's text alone: it sends the protocol's JSON
// text and reads raw frames, so the test checks the wire shapes and not
// only what a Go client of ours would accept.
type wire struct {
	t *testing.T
	c *websocket.Conn
	// early holds requests from the bus that came before the response to
	// a subscribe (a delivery on the new subscription may), for
	// expectRequest.
	early []map[string]any
}

func dial(t *testing.T, url string, header http.Header) *wire {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(16 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return &wire{t: t, c: c}
}

func (w *wire) send(frame string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	if err := w.c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
		w.t.Fatalf("send %.200s: %v", frame, err)
	}
}

// recv reads one frame and decodes it.
func (w *wire) recv() map[string]any {
	w.t.Helper()
	raw := w.recvRaw()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		w.t.Fatalf("frame %s is not a JSON object: %v", raw, err)
	}
	if m["jsonrpc"] != "2.0" {
		w.t.Fatalf("frame %s lacks jsonrpc 2.0", raw)
	}
	return m
}

func (w *wire) recvRaw() []byte {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	_, data, err := w.c.Read(ctx)
	if err != nil {
		w.t.Fatalf("recv: %v", err)
	}
	return data
}

// request sends a request without reading its response.
func (w *wire) request(id any, method, params string) {
	w.t.Helper()
	idJSON, _ := json.Marshal(id)
	frame := fmt.Sprintf(`{"jsonrpc":"2.0","method":%q,"id":%s}`, method, idJSON)
	if params != "" {
		frame = fmt.Sprintf(`{"jsonrpc":"2.0","method":%q,"params":%s,"id":%s}`, method, params, idJSON)
	}
	w.send(frame)
}

// call sends a request and returns its response; requests from the bus
// that arrive first fail the test (use expectRequest for those).
func (w *wire) call(id any, method, params string) map[string]any {
	w.t.Helper()
	w.request(id, method, params)
	m := w.recv()
	if _, isRequest := m["method"]; isRequest {
		w.t.Fatalf("expected the response to %s, got a request %v", method, m)
	}
	if fmt.Sprint(m["id"]) != fmt.Sprint(id) {
		w.t.Fatalf("response id %v, want %v", m["id"], id)
	}
	return m
}

// result returns the result of a successful call.
func (w *wire) result(id any, method, params string) map[string]any {
	w.t.Helper()
	m := w.call(id, method, params)
	res, ok := m["result"].(map[string]any)
	if !ok {
		w.t.Fatalf("%s %s: want a result object, got %v", method, params, m)
	}
	return res
}

// callError returns the error code and message of a failing call.
func (w *wire) callError(id any, method, params string) (int, string) {
	w.t.Helper()
	m := w.call(id, method, params)
	return errorOf(w.t, m)
}

func errorOf(t *testing.T, m map[string]any) (int, string) {
	t.Helper()
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("want an error object, got %v", m)
	}
	if _, hasResult := m["result"]; hasResult {
		t.Fatalf("error response also has a result: %v", m)
	}
	code, _ := e["code"].(float64)
	msg, _ := e["message"].(string)
	return int(code), msg
}

// expectRequest reads a request from the bus and checks its method.
func (w *wire) expectRequest(method string) (id any, params map[string]any) {
	w.t.Helper()
	var m map[string]any
	if len(w.early) > 0 {
		m, w.early = w.early[0], w.early[1:]
	} else {
		m = w.recv()
	}
	if m["method"] != method {
		w.t.Fatalf("expected a %s request from the bus, got %v", method, m)
	}
	id, ok := m["id"]
	if !ok {
		w.t.Fatalf("%s from the bus has no id (the protocol makes it a request): %v", method, m)
	}
	params, _ = m["params"].(map[string]any)
	return id, params
}

// reply answers a request from the bus.
func (w *wire) reply(id any, result string) {
	w.t.Helper()
	idJSON, _ := json.Marshal(id)
	w.send(fmt.Sprintf(`{"jsonrpc":"2.0","result":%s,"id":%s}`, result, idJSON))
}

// initialize sends the protocol's initialize as clientID, with extra members
// added to params.
func (w *wire) initialize(clientID, extra string) map[string]any {
	w.t.Helper()
	params := fmt.Sprintf(`{"clientId":%q,"clientInfo":{"name":"bub","version":"0.2.0"}%s}`, clientID, extra)
	return w.result(1, "initialize", params)
}

// client dials and initializes.
func (b *testBus) client(t *testing.T, clientID, extra string) *wire {
	t.Helper()
	w := dial(t, b.url, nil)
	w.initialize(clientID, extra)
	return w
}

func (w *wire) subscribe(id int, topic, policy string) {
	w.t.Helper()
	params := fmt.Sprintf(`{"topic":%q}`, topic)
	if policy != "" {
		params = fmt.Sprintf(`{"topic":%q,"policy":%q}`, topic, policy)
	}
	w.request(id, "subscribe", params)
	// JSON-RPC does not order the bus's requests after its responses: a
	// message waiting for this subscriber (the default handler's) may be
	// delivered before the subscribe is answered.
	m := w.recv()
	for ; m["method"] != nil; m = w.recv() {
		w.early = append(w.early, m)
	}
	if fmt.Sprint(m["id"]) != fmt.Sprint(id) {
		w.t.Fatalf("response id %v, want %v", m["id"], id)
	}
	if res, _ := m["result"].(map[string]any); res["success"] != true {
		w.t.Fatalf("subscribe %s: %v", topic, m)
	}
}

// publish sends sendMessage without waiting for the answer, which only
// comes once subscribers have answered; read it with recv.
func (w *wire) publish(id int, topic, payload string) {
	w.t.Helper()
	w.send(fmt.Sprintf(`{"jsonrpc":"2.0","method":"sendMessage","params":{"topic":%q,"payload":%s},"id":%d}`, topic, payload, id))
}

// response reads the response to id.
func (w *wire) response(id int) map[string]any {
	w.t.Helper()
	m := w.recv()
	if _, isRequest := m["method"]; isRequest || fmt.Sprint(m["id"]) != fmt.Sprint(id) {
		w.t.Fatalf("expected the response to %d, got %v", id, m)
	}
	return m
}

// receive returns the next value on ch, failing the test if none comes
// within the guard (a launched agent that could not connect reports why
// from its own goroutine, and sends nothing).
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guard):
		t.Fatalf("no %s within %s", what, guard)
		panic("unreachable")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// tWriter sends the bus's log to the test's, with -v.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
