// Package gateway_test measures the coven gateway (services/gateway, started
// through service.New as cmd/gateway does) side by side with a relay floor:
// the least gRPC code that forwards GatewayService.SendMessage to an agent's
// CovenControl stream. Clients, agents and servers share this process and
// talk over real loopback TCP.
//
//	go test -run '^$' -bench . -benchmem -benchtime 2s ./gateway/
//
// See README.md for the method and the figures.
package gateway_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"

	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/conclave-ai/conclave/bench/internal/proc"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkRoundTrip: one SendMessage answered by one text event and done,
// read to the end of the stream, one caller at a time.
func BenchmarkRoundTrip(b *testing.B) {
	for _, start := range []func(*testing.B) *target{startGateway, startRelay} {
		tg := start(b)
		call := echoOnce(echoClient(b, tg))
		warm(b, tg.name, call)
		b.Run(tg.name, func(b *testing.B) { roundTrips(b, call) })
	}
}

// echoOnce is one request to the echo agent, answered with one event
// and done: the round trip the latency benchmarks time.
func echoOnce(callCtx context.Context, client gatewayv1.GatewayServiceClient) func() (int, error) {
	return func() (int, error) { return send(callCtx, client, "echo", "1") }
}

// warm makes 100 calls before timing, so that connections and caches
// are set up.
func warm(b *testing.B, name string, call func() (int, error)) {
	for range 100 {
		if _, err := call(); err != nil {
			b.Fatalf("%s: warm-up: %v", name, err)
		}
	}
}

// roundTrips times calls answered with one event and done, one at a
// time, and reports their percentiles.
func roundTrips(b *testing.B, call func() (int, error)) {
	b.ReportAllocs()
	lat := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		t0 := time.Now()
		n, err := call()
		lat = append(lat, time.Since(t0))
		if err != nil || n != 2 {
			b.Fatalf("%d events, %v", n, err)
		}
	}
	reportPercentiles(b, lat)
}

// streams times requests answered with n events each, read to the end,
// one at a time, and reports the events per second.
func streams(b *testing.B, callCtx context.Context, client gatewayv1.GatewayServiceClient, agent string, n int) {
	b.ReportAllocs()
	for b.Loop() {
		if got, err := send(callCtx, client, agent, strconv.Itoa(n)); err != nil || got != n+1 {
			b.Fatalf("%d events, %v", got, err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "events/s")
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// BenchmarkEvents: streamed events per second from agents to clients.
//
//	1x1:  one agent answers each request with 1,000 text events and done;
//	      one op is one request read to its end.
//	many: BENCH_MANY_AGENTS agents (default 1,000), each with its own client
//	      goroutine; one op is one round in which every client sends one
//	      request to its own agent, answered with 100 text events and done,
//	      all at once.
//
// Each case runs against the gateway and against the relay floor.
func BenchmarkEvents(b *testing.B) {
	const perConn = 10 // agents, or clients, sharing one connection
	many := envInt("BENCH_MANY_AGENTS", 1000)
	for _, start := range []func(*testing.B) *target{startGateway, startRelay} {
		tg := start(b)
		b.Cleanup(tg.stop)
		ctx, cancel := context.WithCancel(context.Background())
		b.Cleanup(cancel)
		var agentConns, clientConns []*grpc.ClientConn
		for range (many + perConn - 1) / perConn {
			a, c := dial(b, tg.addr), dial(b, tg.addr)
			b.Cleanup(func() { _ = a.Close(); _ = c.Close() })
			agentConns, clientConns = append(agentConns, a), append(clientConns, c)
		}
		var wg sync.WaitGroup
		for i := range many {
			wg.Go(func() { startAgent(b, ctx, agentConns[i/perConn], fmt.Sprintf("agent-%d", i)) })
		}
		wg.Wait()
		callCtx := authed(ctx)
		suffix := ""
		if tg.name != "gateway" {
			suffix = "-" + tg.name
		}

		b.Run("1x1"+suffix, func(b *testing.B) {
			streams(b, callCtx, gatewayv1.NewGatewayServiceClient(clientConns[0]), "agent-0", 1000)
		})

		b.Run("many"+suffix, func(b *testing.B) {
			b.ReportAllocs()
			const n = 100
			start := make([]chan struct{}, many)
			finished := make(chan error, many)
			wctx, stop := context.WithCancel(callCtx)
			defer stop()
			for i := range many {
				start[i] = make(chan struct{})
				go func() {
					client := gatewayv1.NewGatewayServiceClient(clientConns[i/perConn])
					agent := fmt.Sprintf("agent-%d", i)
					for {
						select {
						case <-start[i]:
						case <-wctx.Done():
							return
						}
						got, err := send(wctx, client, agent, strconv.Itoa(n))
						if err == nil && got != n+1 {
							err = fmt.Errorf("%s: %d events", agent, got)
						}
						finished <- err
					}
				}()
			}
			cpuStart := proc.CPUTime()
			for b.Loop() {
				for _, s := range start {
					s <- struct{}{}
				}
				for range many {
					if err := <-finished; err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(n*many*b.N)/b.Elapsed().Seconds(), "events/s")
			// The whole process's CPU (clients and agents too, the same in
			// both targets): on a shared machine it says what an event costs
			// better than the wall clock.
			b.ReportMetric(float64((proc.CPUTime()-cpuStart).Microseconds())/float64(n*many*b.N), "cpu-µs/event")
			b.ReportMetric(float64(many), "agents")
		})
	}
}

type memSample struct {
	heap, stack, rss uint64
	goroutines       int
}

func sample() memSample {
	runtime.GC()
	debug.FreeOSMemory()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heap: ms.HeapInuse, stack: ms.StackInuse, rss: residentBytes(), goroutines: runtime.NumGoroutine()}
}

// residentBytes is the process's resident set (VmRSS), 0 if unknown.
func residentBytes() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

type idleResult struct {
	heap, stack, rss, goroutines float64 // per agent
	// writesPerSecond is the store's write rate while the agents sit idle
	// (the gateway only).
	writesPerSecond float64
}

// idleCost starts tg in this process and k idle agents in a child process
// (this test binary, see TestMain), k/perConn agents per connection. Memory
// is sampled before the agents register and again once every agent is
// registered, so the difference is the server's cost of k idle agent
// streams and nothing of the agents' own. With several agents per
// connection the connections are up before the first sample, so only the
// streams are counted; with one agent per connection (perConn 1), as when
// every agent is a process of its own, each agent's connection is counted.
func idleCost(b *testing.B, start func(*testing.B) *target, k, perConn int) idleResult {
	tg := start(b)
	defer tg.stop()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), "BENCH_GATEWAY_IDLE_CLIENT="+tg.addr,
		"BENCH_GATEWAY_IDLE_K="+strconv.Itoa(k), "BENCH_GATEWAY_IDLE_PER_CONN="+strconv.Itoa(perConn))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	out := bufio.NewScanner(outPipe)
	expect := func(line string) {
		for out.Scan() {
			if out.Text() == line {
				return
			}
		}
		b.Fatalf("%s: agent process ended before %q: %v", tg.name, line, out.Err())
	}
	expect("connected")
	time.Sleep(500 * time.Millisecond)
	before := sample()
	if _, err := io.WriteString(in, "go\n"); err != nil {
		b.Fatal(err)
	}
	expect("ready")
	time.Sleep(time.Second) // let every per-agent goroutine settle
	after := sample()
	if dir := os.Getenv("BENCH_HEAP_PROFILE_DIR"); dir != "" {
		// What the held agents keep alive, for `go tool pprof -sample_index=inuse_space`.
		f, err := os.Create(filepath.Join(dir, tg.name+".heap"))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Fatal(err)
		}
		_ = f.Close()
	}
	r := idleResult{
		heap:       (float64(after.heap) - float64(before.heap)) / float64(k),
		stack:      (float64(after.stack) - float64(before.stack)) / float64(k),
		rss:        (float64(after.rss) - float64(before.rss)) / float64(k),
		goroutines: float64(after.goroutines-before.goroutines) / float64(k),
	}
	b.Logf("%s: %d idle agents over %d connections: heap %+.0f B/agent, stacks %+.0f B/agent, RSS %+.0f B/agent, %+.2f goroutines/agent (HeapInuse %d -> %d, StackInuse %d -> %d)",
		tg.name, k, (k+perConn-1)/perConn, r.heap, r.stack, r.rss, r.goroutines, before.heap, after.heap, before.stack, after.stack)
	if tg.writes != nil {
		// Two leases of idleness on default settings: the writes that
		// keep k agents registered.
		const window = 30 * time.Second
		w0 := tg.writes()
		time.Sleep(window)
		r.writesPerSecond = float64(tg.writes()-w0) / window.Seconds()
		if _, err := io.WriteString(in, "status\n"); err != nil {
			b.Fatal(err)
		}
		expect(fmt.Sprintf("held %d", k))
		b.Logf("%s: %.2f store writes/s while %d agents sat idle for %s; all %d still held", tg.name, r.writesPerSecond, k, window, k)
	}
	return r
}

// TestMain doubles as the idle agents' process for BenchmarkIdleAgentMemory.
func TestMain(m *testing.M) {
	if addr := os.Getenv("BENCH_GATEWAY_IDLE_CLIENT"); addr != "" {
		if err := idleAgents(addr, envInt("BENCH_GATEWAY_IDLE_K", 1), envInt("BENCH_GATEWAY_IDLE_PER_CONN", 100)); err != nil {
			fmt.Fprintln(os.Stderr, "idle agents:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// idleAgents connects, says "connected", waits for a line on stdin,
// registers k agents, says "ready", and holds them until stdin closes,
// with a heartbeat every 30s as coven agents send. Each further line on
// stdin makes it say "held N": how many streams the gateway has not ended.
func idleAgents(addr string, k, perConn int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conns := make([]*grpc.ClientConn, (k+perConn-1)/perConn)
	connect := func(i int) error {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		conns[i] = c
		c.Connect()
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				return ctx.Err()
			}
		}
		return nil
	}
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	// One agent per connection: the connection is the agent's, made when
	// it registers (see idleCost).
	connectEach := perConn == 1
	if !connectEach {
		for i := range conns {
			if err := connect(i); err != nil {
				return err
			}
		}
	}
	stdin := bufio.NewReader(os.Stdin)
	fmt.Println("connected")
	if _, err := stdin.ReadString('\n'); err != nil {
		return err
	}
	streams := make([]grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage], k)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	var firstErr error
	var mu sync.Mutex
	for i := range k {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if connectEach {
				if err := connect(i); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
			}
			s, err := register(ctx, conns[i/perConn], fmt.Sprintf("idle-%d", i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			streams[i] = s
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	fmt.Println("ready")
	// One sender per stream at a time: the heartbeat loop and the status
	// check share this.
	var sendMu sync.Mutex
	beat := &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}}
	held := func() int {
		sendMu.Lock()
		defer sendMu.Unlock()
		n := 0
		for _, s := range streams {
			if s.Send(beat) == nil { // the gateway ended it if Send says io.EOF
				n++
			}
		}
		return n
	}
	go func() {
		for range time.Tick(30 * time.Second) {
			held()
		}
	}()
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		fmt.Printf("held %d\n", held())
	}
	return nil
}

// idleRun is one measurement of idle agents on the floor and then on the
// gateway, made once however often the framework calls its benchmark.
type idleRun struct {
	sync.Once
	gw, floor idleResult
	k         int
}

// measure runs it the first time: the env variable's count of agents (def
// without it), perConn agents per connection.
func (r *idleRun) measure(b *testing.B, env string, def, perConn int) (gw, floor idleResult, k int) {
	r.Do(func() {
		r.k = envInt(env, def)
		r.floor = idleCost(b, startRelay, r.k, perConn)
		r.gw = idleCost(b, startGateway, r.k, perConn)
	})
	return r.gw, r.floor, r.k
}

var idleShared, idleConnEach idleRun

// BenchmarkIdleAgentMemory connects BENCH_IDLE_AGENTS idle agents (default
// 10,000) from a child process, 100 streams per client connection, first to
// the relay floor and then to the gateway, and reports the server's memory
// per agent (heap in use plus goroutine stacks, after GC). The measurement is
// made once, however often the framework calls the function.
func BenchmarkIdleAgentMemory(b *testing.B) {
	gw, fl, k := idleShared.measure(b, "BENCH_IDLE_AGENTS", 10000, 100)
	b.ReportMetric(gw.heap+gw.stack, "bytes/agent")
	b.ReportMetric(gw.heap, "heap-bytes/agent")
	b.ReportMetric(gw.stack, "stack-bytes/agent")
	b.ReportMetric(gw.goroutines, "goroutines/agent")
	b.ReportMetric(fl.heap+fl.stack, "floor-bytes/agent")
	b.ReportMetric(float64(k), "agents")
	b.ReportMetric(gw.writesPerSecond, "store-writes/s")
}

// BenchmarkIdleAgentMemoryConnEach is BenchmarkIdleAgentMemory with one
// connection per agent, as real agents have (each is a process of its
// own): BENCH_IDLE_CONN_AGENTS agents (default 5,000), each dialling and
// registering on its own connection, first to the floor (a bare grpc-go
// server holding the same one-stream connections) and then to the
// gateway. It reports the server's heap and stacks per agent, its
// resident set per agent, and the gateway's ratio to the floor.
func BenchmarkIdleAgentMemoryConnEach(b *testing.B) {
	gw, fl, k := idleConnEach.measure(b, "BENCH_IDLE_CONN_AGENTS", 5000, 1)
	b.ReportMetric(gw.heap+gw.stack, "bytes/agent")
	b.ReportMetric(gw.rss, "rss-bytes/agent")
	b.ReportMetric(gw.goroutines, "goroutines/agent")
	b.ReportMetric(fl.heap+fl.stack, "floor-bytes/agent")
	b.ReportMetric(fl.rss, "floor-rss-bytes/agent")
	b.ReportMetric((gw.heap+gw.stack)/(fl.heap+fl.stack), "ratio")
	b.ReportMetric(float64(k), "agents")
}

// BenchmarkReconnect holds BENCH_RECONNECT_AGENTS agents (default 10,000)
// with `conclave agent swarm --reconnect`, restarts the gateway (a graceful
// shutdown, then a new process on the same address and store, as a rolling
// update does), and reports how long the agents took to be registered
// again, from the new gateway's start: on the embedded store, and on
// DynamoDB (dynalite, over the client a deployed gateway uses), one after
// the other in the same run.
func BenchmarkReconnect(b *testing.B) {
	reconnectOnce.Do(func() {
		k := envInt("BENCH_RECONNECT_AGENTS", 10000)
		reconnectOnce.k = k
		reconnectOnce.embedded = reconnect(b, k, boltAt(filepath.Join(tempDir(b), "state.db")))
		dyn, err := testenv.Dynalite(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		defer dyn.Stop()
		reconnectOnce.dynamo = reconnect(b, k, dynamoAt(dyn.Endpoint))
	})
	b.ReportMetric(reconnectOnce.embedded, "s-to-reregister")
	b.ReportMetric(reconnectOnce.dynamo, "s-to-reregister-dynamodb")
	b.ReportMetric(float64(reconnectOnce.k), "agents")
}

var reconnectOnce struct {
	sync.Once
	embedded, dynamo float64
	k                int
}

func reconnect(b *testing.B, k int, open storeOpener) float64 {
	dir := tempDir(b)
	bin := filepath.Join(dir, "conclave")
	if err := testenv.GoBuild(context.Background(), bin, "./cmd/conclave"); err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	gw := startGatewayAt(b, addr, open)
	swarm := exec.Command(bin, "agent", "swarm", "--addr", addr, "--count", strconv.Itoa(k), "--reconnect", "--report", "100ms")
	swarm.Stderr = os.Stderr
	in, err := swarm.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := swarm.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := swarm.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = swarm.Wait() }()
	lines := bufio.NewScanner(outPipe)
	var st struct {
		Event      string  `json:"event"`
		Registered int     `json:"registered"`
		Seconds    float64 `json:"seconds"`
	}
	next := func() {
		if !lines.Scan() {
			b.Fatalf("swarm ended: %v", lines.Err())
		}
		if err := json.Unmarshal(lines.Bytes(), &st); err != nil {
			b.Fatal(err)
		}
	}
	for next(); st.Event != "registered"; next() {
	}
	b.Logf("%d agents registered in %.2fs", k, st.Seconds)
	gw.stop()
	start := time.Now()
	gw = startGatewayAt(b, addr, open)
	defer gw.stop()
	for next(); st.Registered < k; next() {
	}
	took := time.Since(start).Seconds()
	b.Logf("after a restart, %d agents registered again in %.2fs", k, took)
	return took
}
