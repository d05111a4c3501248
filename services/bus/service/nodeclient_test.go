package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// nodeClients is the script TestNodeWebSocketClients runs: Node.js's own
// WebSocket (undici's, the WHATWG client browsers implement) as a
// subscriber and a publisher. Each step waits for the last; every event is
// printed as a JSON line.
const nodeClients = `
const url = process.env.BUS_URL;
const big = 'x'.repeat(100000); // over 64 KiB: the 64-bit length form
const out = (o) => console.log(JSON.stringify(o));
setTimeout(() => { out({event: 'stuck'}); process.exit(1); }, 60000);
function open() {
  const ws = new WebSocket(url);
  const waiting = [];
  ws.onmessage = (e) => { const m = JSON.parse(e.data); const w = waiting.shift(); if (w) w(m); else out({event: 'unexpected', m}); };
  ws.next = () => new Promise((resolve) => waiting.push(resolve));
  ws.call = (id, method, params) => { ws.send(JSON.stringify({jsonrpc: '2.0', id, method, params})); return ws.next(); };
  return new Promise((resolve, reject) => { ws.onopen = () => resolve(ws); ws.onerror = (e) => reject(new Error('cannot connect')); });
}
(async () => {
  const sub = await open();
  const pub = await open();
  out({event: 'init', sub: await sub.call(1, 'initialize', {clientId: 'node-sub'}), pub: await pub.call(1, 'initialize', {clientId: 'node-pub'})});
  out({event: 'subscribe', m: await sub.call(2, 'subscribe', {topic: 'node:*'})});
  const delivered = sub.next();
  const answered = pub.call(3, 'sendMessage', {topic: 'node:1', payload: {text: big}});
  const d = await delivered;
  out({event: 'delivered', method: d.method, length: d.params.payload.text.length});
  sub.send(JSON.stringify({jsonrpc: '2.0', id: d.id, result: {success: true}}));
  const r = await answered;
  out({event: 'answered', ok: r.result !== undefined});
  sub.onclose = (e) => { out({event: 'closed', code: e.code, reason: e.reason, clean: e.wasClean}); pub.close(); process.exit(0); };
  sub.close(4000, 'done');
})().catch((e) => { out({event: 'error', message: String(e)}); process.exit(1); });
`

// TestNodeWebSocketClients: a WebSocket client that is not Go's, the one
// Node.js ships (undici, the WHATWG client), speaks bub with the bus: a
// subscriber gets a publish of 100 KB and answers it, and its close
// handshake ends clean with the code it sent echoed.
func TestNodeWebSocketClients(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus and Node.js")
	}
	t.Parallel()
	node, _, err := testenv.NodeScript()
	if err != nil {
		t.Fatal(err)
	}
	bus := startBus(t, defaultConfig(t, nil), busOption{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "-e", nodeClients)
	cmd.Env = append(cmd.Environ(), "BUS_URL="+bus.url)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s\n%s", err, stdout, stderr.String())
	}
	events := map[string]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("node printed %q", sc.Text())
		}
		events[e["event"].(string)] = e
	}
	for _, check := range []struct {
		event, key string
		want       any
	}{
		{"delivered", "method", "sendMessage"},
		{"delivered", "length", float64(100000)},
		{"answered", "ok", true},
		{"closed", "code", float64(4000)},
		{"closed", "clean", true},
	} {
		if got := events[check.event][check.key]; got != check.want {
			t.Errorf("%s %s: %v, want %v (node printed %s)", check.event, check.key, got, check.want, strings.TrimSpace(string(stdout)))
		}
	}
}
