// Package bus benchmarks the bus against its floor (a raw WebSocket relay
// built here) and NATS request/reply (nats-server in process), side by side
// in one run. Run:
//
//	cd bench && go test -run '^$' -bench . -benchmem -benchtime 3s ./bus/
package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/conclave-ai/conclave/bench/internal/proc"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bus/service"
)

var payload = json.RawMessage(`{"type":"task_request","task_id":"task-789","description":"Analyze the log file"}`)

// startBus runs a bus in process on a loopback port, open, without rate
// limits, and returns its URL.
func startBus(b *testing.B) string {
	b.Helper()
	var cfg struct{ Bus service.Config }
	env := map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_ADDR": "127.0.0.1:0", "CONCLAVE_BUS_RATE": "1e9", "CONCLAVE_BUS_BURST": "1000000000"}
	if err := config.Load(context.Background(), &cfg, "bus", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard); err != nil {
		b.Fatal(err)
	}
	cfg.Bus.Addr = "127.0.0.1:0"
	dir := b.TempDir()
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		b.Fatal(err)
	}
	if err := queue.EnsureAll(ctx, q, service.Queues(service.Config{})...); err != nil {
		b.Fatal(err)
	}
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	bus, err := service.New(cfg.Bus, service.Deps{Store: st, Queue: q, Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	asServer(func() { go func() { _ = bus.Run(runCtx); close(done) }() })
	b.Cleanup(func() { cancel(); <-done })
	<-bus.Ready()
	return "ws://" + bus.Endpoints()[0].Address
}

func dial(b *testing.B, url string, h jsonrpc.Handler) *jsonrpc.Conn {
	b.Helper()
	ws, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		b.Fatal(err)
	}
	c := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), h, jsonrpc.WithTracePropagation(false))
	b.Cleanup(func() { _ = c.Close() })
	return c
}

func mustCall(b *testing.B, c *jsonrpc.Conn, method string, params any) {
	b.Helper()
	if err := c.Call(context.Background(), method, params, nil); err != nil {
		b.Fatalf("%s: %v", method, err)
	}
}

// percentiles reports p50 and p99 of the measured round trips.
func percentiles(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRoundTrip measures publisher sendMessage → bus → subscriber
// processMessage → ack → publisher, against the same exchange through a
// raw WebSocket relay and through NATS request/reply.
func BenchmarkRoundTrip(b *testing.B) {
	b.Run("bus", func(b *testing.B) {
		// The same clients as the relay's: raw WebSockets writing and
		// reading the JSON-RPC frames, so that only the server differs.
		url := startBus(b)
		answer := []byte(`{"processed":true,"should_retry":false,"retry_seconds":0,"message":"ok"}`)
		rawSubscriber(b, url, "agent", "agent:bench", `,"capabilities":{"processMessage":true}`, `,"policy":"continueAll"`, answer, nil)
		pub := rawClient(b, url, "pub", "")
		frame := []byte(`{"jsonrpc":"2.0","id":7,"method":"sendMessage","params":{"topic":"agent:bench","payload":` + string(payload) + `}}`)
		times := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		cpuStart := proc.CPUTime()
		for b.Loop() {
			start := time.Now()
			if err := pub.Write(context.Background(), websocket.MessageText, frame); err != nil {
				b.Fatal(err)
			}
			if _, _, err := pub.Read(context.Background()); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		reportCPU(b, cpuStart, len(times))
		percentiles(b, times)
	})

	agentMethods := jsonrpc.Methods{"processMessage": func(context.Context, *jsonrpc.Request) (any, error) {
		return json.RawMessage(`{"processed":true,"should_retry":false,"retry_seconds":0,"message":"ok"}`), nil
	}}
	// Publisher and agent on pkg/jsonrpc, as the bus's own peers are: the
	// agent's handler on a goroutine per call, or (inline_agent) on its
	// read loop, as jsonrpc.Inline lets a quick handler run.
	b.Run("bus_jsonrpc_clients", func(b *testing.B) { roundTripJSONRPC(b, agentMethods) })
	b.Run("bus_jsonrpc_clients_inline_agent", func(b *testing.B) { roundTripJSONRPC(b, jsonrpc.Inline(agentMethods)) })

	b.Run("relay", func(b *testing.B) {
		url := startRelay(b)
		sub, _, err := websocket.Dial(context.Background(), url+"?role=sub", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer sub.CloseNow()
		go func() { // the subscriber answers every frame
			for {
				_, data, err := sub.Read(context.Background())
				if err != nil {
					return
				}
				_ = data
				if sub.Write(context.Background(), websocket.MessageText, []byte(`{"processed":true,"message":"ok"}`)) != nil {
					return
				}
			}
		}()
		pub, _, err := websocket.Dial(context.Background(), url+"?role=pub", nil)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.CloseNow()
		frame := []byte(`{"topic":"agent:bench","payload":` + string(payload) + `}`)
		times := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		cpuStart := proc.CPUTime()
		for b.Loop() {
			start := time.Now()
			if err := pub.Write(context.Background(), websocket.MessageText, frame); err != nil {
				b.Fatal(err)
			}
			if _, _, err := pub.Read(context.Background()); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		reportCPU(b, cpuStart, len(times))
		percentiles(b, times)
	})

	b.Run("nats", func(b *testing.B) {
		ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
		if err != nil {
			b.Fatal(err)
		}
		go ns.Start()
		defer ns.Shutdown()
		if !ns.ReadyForConnections(10 * time.Second) {
			b.Fatal("nats-server not ready")
		}
		sub, err := nats.Connect(ns.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Close()
		reply := []byte(`{"processed":true,"message":"ok"}`)
		if _, err := sub.Subscribe("agent.bench", func(m *nats.Msg) { _ = m.Respond(reply) }); err != nil {
			b.Fatal(err)
		}
		_ = sub.Flush()
		pub, err := nats.Connect(ns.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		times := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		cpuStart := proc.CPUTime()
		for b.Loop() {
			start := time.Now()
			if _, err := pub.Request("agent.bench", payload, 10*time.Second); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		reportCPU(b, cpuStart, len(times))
		percentiles(b, times)
	})
}

// roundTripJSONRPC measures the round trip with publisher and agent on
// pkg/jsonrpc, the agent answering with h.
func roundTripJSONRPC(b *testing.B, h jsonrpc.Handler) {
	url := startBus(b)
	agent := dial(b, url, h)
	mustCall(b, agent, "initialize", map[string]any{"clientId": "agent", "capabilities": map[string]bool{"processMessage": true}})
	mustCall(b, agent, "subscribe", map[string]string{"topic": "agent:bench"})
	pub := dial(b, url, nil)
	mustCall(b, pub, "initialize", map[string]string{"clientId": "pub"})
	params := map[string]any{"topic": "agent:bench", "payload": payload}
	times := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	cpuStart := proc.CPUTime()
	for b.Loop() {
		start := time.Now()
		var res json.RawMessage
		if err := pub.Call(context.Background(), "sendMessage", params, &res); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	reportCPU(b, cpuStart, len(times))
	percentiles(b, times)
}

// startRelay is the floor: a WebSocket server that passes each publisher
// frame to the subscriber and the subscriber's answer back, with nothing
// else (no JSON-RPC, no routing, no policies).
func startRelay(b *testing.B) string {
	b.Helper()
	var (
		mu   sync.Mutex
		sub  *websocket.Conn
		subQ = make(chan struct{})
	)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		if r.URL.Query().Get("role") == "sub" {
			mu.Lock()
			sub = c
			mu.Unlock()
			close(subQ)
			<-r.Context().Done()
			return
		}
		<-subQ
		mu.Lock()
		s := sub
		mu.Unlock()
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			if s.Write(context.Background(), websocket.MessageText, data) != nil {
				return
			}
			_, answer, err := s.Read(context.Background())
			if err != nil {
				return
			}
			if c.Write(context.Background(), websocket.MessageText, answer) != nil {
				return
			}
		}
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "ws://" + l.Addr().String()
}

// BenchmarkFanOut1000 publishes to 1,000 subscribers, each on its own
// connection and answering every message, and reports deliveries per
// second: through the bus (continueAll, so they are delivered to at once),
// through the least WebSocket fan-out (startFanOut, with and without
// coalescing each subscriber's writes; the same
// subscribers), and through NATS (a request whose 1,000 replies the
// publisher waits for). The publisher has one message in flight, or eight.
func BenchmarkFanOut1000(b *testing.B) {
	const subscribers = 1000
	for _, inflight := range []int{1, 8} {
		b.Run(fmt.Sprintf("bus/inflight=%d", inflight), func(b *testing.B) {
			url := startBus(b)
			var delivered atomic.Int64
			for i := range subscribers {
				rawSubscriber(b, url, fmt.Sprintf("sub-%d", i), "fan:*", "", `,"policy":"continueAll"`, []byte(`{"success":true}`), &delivered)
			}
			pub := dial(b, url, nil)
			mustCall(b, pub, "initialize", map[string]string{"clientId": "pub"})
			params := map[string]any{"topic": "fan:1", "payload": payload}
			publish := func() error {
				var res struct{ Acks []json.RawMessage }
				if err := pub.Call(context.Background(), "sendMessage", params, &res); err != nil {
					return err
				}
				if len(res.Acks) != subscribers {
					return fmt.Errorf("%d acks, want %d", len(res.Acks), subscribers)
				}
				return nil
			}
			fanOut(b, inflight, publish, &delivered)
		})
		// The same least server, writing each frame on its own (plainws)
		// and coalescing them per connection (floor).
		for _, ws := range []struct {
			name     string
			coalesce bool
		}{{"plainws", false}, {"floor", true}} {
			b.Run(fmt.Sprintf("%s/inflight=%d", ws.name, inflight), func(b *testing.B) {
				url := startFanOut(b, ws.coalesce)
				var delivered atomic.Int64
				for i := range subscribers {
					rawSubscriber(b, url+"?role=sub", fmt.Sprintf("sub-%d", i), "fan:*", "", "", []byte(`{"success":true}`), &delivered)
				}
				pub := newPlainPublisher(b, url)
				fanOut(b, inflight, func() error { return pub.publish(subscribers) }, &delivered)
			})
		}
		b.Run(fmt.Sprintf("nats/inflight=%d", inflight), func(b *testing.B) {
			ns := startNATS(b)
			var delivered atomic.Int64
			reply := []byte(`{"success":true}`)
			for range subscribers {
				sub, err := nats.Connect(ns.ClientURL())
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(sub.Close)
				if _, err := sub.Subscribe("fan.1", func(m *nats.Msg) { delivered.Add(1); _ = m.Respond(reply) }); err != nil {
					b.Fatal(err)
				}
				if err := sub.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			pub, err := nats.Connect(ns.ClientURL())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pub.Close)
			publish := func() error {
				inbox := nats.NewInbox()
				replies := make(chan *nats.Msg, subscribers)
				s, err := pub.ChanSubscribe(inbox, replies)
				if err != nil {
					return err
				}
				defer func() { _ = s.Unsubscribe() }()
				if err := pub.PublishRequest("fan.1", inbox, payload); err != nil {
					return err
				}
				timeout := time.After(30 * time.Second)
				for range subscribers {
					select {
					case <-replies:
					case <-timeout:
						return errors.New("replies missing after 30s")
					}
				}
				return nil
			}
			fanOut(b, inflight, publish, &delivered)
		})
	}
}

// frameID is the value of a JSON-RPC frame's "id" member, as it is
// written (the bench's frames have it before any nested object).
func frameID(frame []byte) []byte {
	i := bytes.Index(frame, []byte(`"id":`))
	if i < 0 {
		return []byte("null")
	}
	id := frame[i+5:]
	if j := bytes.IndexAny(id, ",}"); j >= 0 {
		id = id[:j]
	}
	return id
}

// plainPublisher publishes to startFanOut's server on one WebSocket,
// several messages in flight, each waiting for its own answer.
type plainPublisher struct {
	c      *websocket.Conn
	nextID atomic.Int64
	mu     sync.Mutex
	wait   map[string]chan struct{}
}

func newPlainPublisher(b *testing.B, url string) *plainPublisher {
	b.Helper()
	c, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.CloseNow() })
	p := &plainPublisher{c: c, wait: map[string]chan struct{}{}}
	go func() {
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			id := string(frameID(data))
			p.mu.Lock()
			done := p.wait[id]
			delete(p.wait, id)
			p.mu.Unlock()
			if done != nil {
				close(done)
			}
		}
	}()
	return p
}

// publish sends one message and waits for its answer, which comes once
// all the server's subscribers (subscribers of them) have answered.
func (p *plainPublisher) publish(subscribers int) error {
	id := strconv.FormatInt(p.nextID.Add(1), 10)
	done := make(chan struct{})
	p.mu.Lock()
	p.wait[id] = done
	p.mu.Unlock()
	frame := `{"jsonrpc":"2.0","id":` + id + `,"method":"sendMessage","params":{"topic":"fan:1","payload":` + string(payload) + `}}`
	if err := p.c.Write(context.Background(), websocket.MessageText, []byte(frame)); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no answer from %d subscribers after 30s", subscribers)
	}
}

// fanOut runs publish b.N times, inflight at once, and reports deliveries
// per second.
func fanOut(b *testing.B, inflight int, publish func() error, delivered *atomic.Int64) {
	b.ReportAllocs()
	b.ResetTimer()
	delivered.Store(0)
	start, cpuStart := time.Now(), proc.CPUTime()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	total := int64(b.N)
	stopProfile := profileServer(b)
	for range inflight {
		wg.Go(func() {
			for next.Add(1) <= total {
				if err := publish(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stopProfile()
	n := float64(delivered.Load())
	b.ReportMetric(n/time.Since(start).Seconds(), "deliveries/s")
	b.ReportMetric(float64((proc.CPUTime()-cpuStart).Nanoseconds())/1e3/n, "cpu-µs/delivery")
}

// asServer runs start, which starts a server's goroutines, with the
// profiler label side=server, which every goroutine they start inherits:
// a CPU profile of a fan-out run then tells the server's samples from
// the clients' (go tool pprof -tagfocus side=server). The runtime's own
// (the garbage collector, the scheduler's idle work) carry no label.
func asServer(start func()) {
	pprof.Do(context.Background(), pprof.Labels("side", "server"), func(context.Context) { start() })
}

// profileServer starts a CPU profile of the timed part of a fan-out run
// when BENCH_CPU_PROFILE_DIR names a directory, into <benchmark>.prof
// there, and returns what stops it. Its samples labelled side=server
// (asServer) are the server's own: `go tool pprof -tags` sums them.
func profileServer(b *testing.B) (stop func()) {
	dir := os.Getenv("BENCH_CPU_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, strings.NewReplacer("/", "_", "=", "").Replace(b.Name())+".prof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// reportCPU reports the process's CPU time per operation since start.
func reportCPU(b *testing.B, start time.Duration, ops int) {
	if ops > 0 {
		b.ReportMetric(float64((proc.CPUTime()-start).Nanoseconds())/1e3/float64(ops), "cpu-µs/op")
	}
}

func startNATS(b *testing.B) *natsserver.Server {
	b.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxConn: 10000})
	if err != nil {
		b.Fatal(err)
	}
	asServer(func() { go ns.Start() })
	b.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		b.Fatal("nats-server not ready")
	}
	return ns
}

// rawClient opens a WebSocket to the bus and initializes it as clientID,
// with extra initialize params, writing and reading the frames itself.
func rawClient(b *testing.B, url, clientID, extra string) *websocket.Conn {
	b.Helper()
	c, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.CloseNow() })
	rawCall(b, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientId":"`+clientID+`"`+extra+`}}`)
	return c
}

func rawCall(b *testing.B, c *websocket.Conn, frame string) {
	b.Helper()
	if err := c.Write(context.Background(), websocket.MessageText, []byte(frame)); err != nil {
		b.Fatal(err)
	}
	_, data, err := c.Read(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if bytes.Contains(data, []byte(`"error"`)) {
		b.Fatalf("%s: %s", frame, data)
	}
}

// rawSubscriber connects a raw client subscribed to topic that answers
// every request with result, counting them in delivered.
func rawSubscriber(b *testing.B, url, clientID, topic, initExtra, subExtra string, result []byte, delivered *atomic.Int64) {
	b.Helper()
	c := rawClient(b, url, clientID, initExtra)
	rawCall(b, c, `{"jsonrpc":"2.0","id":2,"method":"subscribe","params":{"topic":"`+topic+`"`+subExtra+`}}`)
	go func() {
		var answer []byte
		for {
			_, data, err := c.Read(context.Background())
			if err != nil {
				return
			}
			// The bus writes a request's id right after "jsonrpc".
			i := bytes.Index(data, []byte(`"id":`))
			if i < 0 {
				continue
			}
			id := data[i+5:]
			id = id[:bytes.IndexAny(id, ",}")]
			answer = append(append(append(append(answer[:0], `{"jsonrpc":"2.0","id":`...), id...), `,"result":`...), result...)
			answer = append(answer, '}')
			if delivered != nil {
				delivered.Add(1)
			}
			if c.Write(context.Background(), websocket.MessageText, answer) != nil {
				return
			}
		}
	}()
}
