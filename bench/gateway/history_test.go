package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/bench/internal/proc"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

// withHistory turns history on, on cmd/gateway's defaults (flush 1s, TTL
// 30 days).
func withHistory(c *service.Config) {
	c.History, c.HistoryTTL, c.HistoryFlush, c.DetachedTimeout = true, 720*time.Hour, time.Second, 10*time.Minute
}

// sendInThread makes one SendMessage call in thread (none: a new one)
// and reads its stream to the end; it returns the number of the agent's
// events received.
func sendInThread(ctx context.Context, client gatewayv1.GatewayServiceClient, agent, thread, content string) (int, error) {
	stream, err := client.SendMessage(ctx, &gatewayv1.SendMessageRequest{AgentId: agent, ThreadId: thread, Content: content})
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		// The gateway's first response carries only the request_id; the
		// relay floor sends none, and neither is an agent's event.
		if m.GetEvent() != nil {
			n++
		}
	}
}

// BenchmarkHistoryLoad: BENCH_LOAD_PAIRS clients (default 50), each with
// its own agent, send request after request, each in its own thread, all
// at once; every answer is 10 text events and done. One op is one request.
// The same load runs with history off and on, one after the other in one
// run, on the embedded store (tmpfs) and on DynamoDB (dynalite); any
// error fails the benchmark. It reports messages per second and the store
// writes per message (all of them: the registry's lease renewals too, a
// few a minute).
func BenchmarkHistoryLoad(b *testing.B) {
	pairs := envInt("BENCH_LOAD_PAIRS", 50)
	dyn, err := testenv.Dynalite(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(dyn.Stop)
	stores := []struct {
		name string
		open func(b *testing.B) storeOpener
	}{
		{"embedded", func(b *testing.B) storeOpener { return boltAt(filepath.Join(tempDir(b), "state.db")) }},
		{"dynamodb", func(*testing.B) storeOpener { return dynamoAt(dyn.Endpoint) }},
	}
	for _, st := range stores {
		for i, mode := range []string{"history-off", "history-on"} {
			b.Run(st.name+"/"+mode, func(b *testing.B) {
				var tune []func(*service.Config)
				if mode == "history-on" {
					tune = append(tune, withHistory)
				}
				tg := startGatewayAt(b, "127.0.0.1:0", st.open(b), tune...)
				defer tg.stop()
				historyLoad(b, tg, pairs, fmt.Sprintf("%s-%d-%d", mode, i, time.Now().UnixNano()))
			})
		}
	}
}

func historyLoad(b *testing.B, tg *target, pairs int, run string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agentConn, clientConn := dial(b, tg.addr), dial(b, tg.addr)
	defer func() { _ = agentConn.Close(); _ = clientConn.Close() }()
	for i := range pairs {
		startAgent(b, ctx, agentConn, fmt.Sprintf("%s-agent-%d", run, i))
	}
	client := gatewayv1.NewGatewayServiceClient(clientConn)
	callCtx := authed(ctx)
	// Warm up: each client's thread exists and is known to the replica,
	// as in a conversation under way.
	for i := range pairs {
		if _, err := sendInThread(callCtx, client, fmt.Sprintf("%s-agent-%d", run, i), fmt.Sprintf("%s-thread-%d", run, i), "10"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	writes, cpuStart := tg.writes(), proc.CPUTime()
	var (
		mu     sync.Mutex
		errs   int
		first  error
		next   = make(chan struct{}, pairs)
		wg     sync.WaitGroup
		issued int
	)
	start := time.Now()
	for i := range pairs {
		wg.Go(func() {
			agent, thread := fmt.Sprintf("%s-agent-%d", run, i), fmt.Sprintf("%s-thread-%d", run, i)
			for range next {
				n, err := sendInThread(callCtx, client, agent, thread, "10")
				if err == nil && n != 11 {
					err = fmt.Errorf("%s: %d events, want 11", agent, n)
				}
				if err != nil {
					mu.Lock()
					errs++
					first = cmpOr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for b.Loop() {
		next <- struct{}{}
		issued++
	}
	close(next)
	wg.Wait()
	took, cpu := time.Since(start), proc.CPUTime()-cpuStart
	if errs > 0 {
		b.Fatalf("%d of %d requests failed, the first: %v", errs, issued, first)
	}
	b.ReportMetric(float64(issued)/took.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(issued), "cpu-µs/msg")
	b.ReportMetric(float64(tg.writes()-writes)/float64(issued), "writes/msg")
	b.ReportMetric(0, "errors")
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// BenchmarkRESTRoundTrip: one SendMessage answered by one text event and
// done, one caller at a time, over gRPC and over REST (POST
// /v1/agents/{id}/messages, newline-delimited JSON read to its end, on a
// kept-alive HTTP/1.1 connection), against one gateway in one run, history
// off as in BenchmarkRoundTrip. It reports each path's p50 and p99.
func BenchmarkRESTRoundTrip(b *testing.B) {
	tg := startGateway(b)
	callCtx, client := echoClient(b, tg)

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	b.Cleanup(hc.CloseIdleConnections)
	url := "http://" + tg.http + "/v1/agents/echo/messages"
	rest := func() (int, error) {
		req, err := http.NewRequestWithContext(callCtx, http.MethodPost, url, strings.NewReader(`{"content":"1"}`))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		lines := 0
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines++
		}
		// The first line carries only the request_id; the rest, events.
		return lines - 1, sc.Err()
	}
	paths := []struct {
		name string
		call func() (int, error)
	}{
		{"grpc", echoOnce(callCtx, client)},
		{"rest", rest},
	}
	for _, p := range paths {
		warm(b, p.name, p.call)
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) { roundTrips(b, p.call) })
	}
}
