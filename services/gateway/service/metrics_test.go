package service_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

// cuttableStore is a real store one replica reaches through a path that
// the test can cut.
type cuttableStore struct {
	store.Store
	cut atomic.Bool
}

var errStoreCut = errors.New("store unreachable")

func (c *cuttableStore) Put(ctx context.Context, table string, it store.Item, conds ...store.Condition) (store.Item, error) {
	if c.cut.Load() {
		return store.Item{}, errStoreCut
	}
	return c.Store.Put(ctx, table, it, conds...)
}

func (c *cuttableStore) Get(ctx context.Context, table string, k store.Key) (store.Item, error) {
	if c.cut.Load() {
		return store.Item{}, errStoreCut
	}
	return c.Store.Get(ctx, table, k)
}

// scraper reads one replica's /metrics and remembers which metrics a test
// checked, so that they can be compared with docs/metrics.md.
type scraper struct {
	t       *testing.T
	url     string
	mu      sync.Mutex
	checked map[string]bool
}

func (s *scraper) value(name string, labels ...string) float64 {
	s.mu.Lock()
	s.checked[name] = true
	s.mu.Unlock()
	return metricstest.Scrape(s.t, s.url+"/metrics").Value(name, labels...)
}

// moved waits until metric name (with labels) reaches at least want.
func (s *scraper) moved(name string, want float64, labels ...string) {
	s.t.Helper()
	testenv.Eventually(s.t, time.Minute, fmt.Sprintf("%s%v reaching %v", name, labels, want), func() bool { return s.value(name, labels...) >= want })
}

// TestGatewayMetrics drives every event docs/metrics.md lists for the
// gateway and checks, on /metrics parsed as Prometheus parses it, that its
// metric moved; and that the metrics checked are exactly the documented
// ones.
func TestGatewayMetrics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shared := openStore(t)
	cut := &cuttableStore{Store: shared}
	checked := map[string]bool{}
	connA, urlA := startTuned(t, "gw-metrics", cut, func(c *service.Config) {
		c.Lease, c.AgentTimeout, c.QueueDepth, c.MaxHeartbeats = 900*time.Millisecond, 5*time.Second, 1, 5
		c.AgentTokens = []string{"locked=locked-secret-0123456789"}
	})
	connB, urlB := startTuned(t, "gw-other", shared, func(c *service.Config) { c.AgentTimeout = 10 * time.Minute })
	a := &scraper{t: t, url: urlA, checked: checked}
	b := &scraper{t: t, url: urlB, checked: checked}
	clientA, clientB := gatewayv1.NewGatewayServiceClient(connA), gatewayv1.NewGatewayServiceClient(connB)
	refusedWith := func(conn *grpc.ClientConn, reg *covenpb.AgentMessage) error {
		stream, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
		if err != nil {
			return err
		}
		_ = stream.Send(reg)
		for {
			if _, err := stream.Recv(); err != nil {
				return err
			}
		}
	}
	register := func(id string) *covenpb.AgentMessage {
		return &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}}
	}

	// The lease: taken, then renewed.
	a.moved("conclave_gateway_lease_writes_total", 1, "outcome", "established")
	a.moved("conclave_gateway_lease_writes_total", 1, "outcome", "renewed")
	a.moved("conclave_gateway_lease_write_duration_seconds", 2)

	// Registrations, by outcome, and the connected-agents gauge.
	// The agent timeout here is 5s, and the scrapes between two requests
	// to echo can take longer on a busy machine.
	echoAgentBeating(t, ctx, connA, "echo", time.Second)
	a.moved("conclave_gateway_registrations_total", 1, "outcome", "welcome")
	a.moved("conclave_gateway_agents_connected", 1, "replica", "gw-metrics")
	if err := refusedWith(connA, register("echo")); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate: %v", err)
	}
	a.moved("conclave_gateway_registrations_total", 1, "outcome", "duplicate")
	if err := refusedWith(connA, register("locked")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	a.moved("conclave_gateway_registrations_total", 1, "outcome", "unauthenticated")
	if err := refusedWith(connA, &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("heartbeat first: %v", err)
	}
	a.moved("conclave_gateway_registrations_total", 1, "outcome", "invalid")

	// Requests, by outcome, with their durations and events.
	if got, _ := readReply(t, authed(ctx), clientA, &gatewayv1.SendMessageRequest{AgentId: "echo", Content: "hi"}); len(got) != 2 {
		t.Fatalf("echo reply: %v", got)
	}
	a.moved("conclave_gateway_requests_total", 1, "outcome", "done")
	a.moved("conclave_gateway_events_relayed_total", 2)
	a.moved("conclave_gateway_request_first_event_duration_seconds", 1)
	a.moved("conclave_gateway_request_duration_seconds", 1)
	if r := send(authed(ctx), clientA, &gatewayv1.SendMessageRequest{AgentId: "ghost"}); status.Code(r.err) != codes.NotFound {
		t.Fatalf("unknown agent: %v", r)
	}
	a.moved("conclave_gateway_requests_total", 1, "outcome", "not_found")

	// A2A calls, and the tasks whose end a replica recorded.
	if code, body := rpc(t, urlA+"/a2a/echo", token, "application/json", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"metrics-1","role":"ROLE_USER","parts":[{"text":"hi"}]}}}`); code != http.StatusOK || !strings.Contains(body, "TASK_STATE_COMPLETED") {
		t.Fatalf("A2A SendMessage: %d %s", code, body)
	}
	a.moved("conclave_gateway_a2a_calls_total", 1, "method", "SendMessage", "outcome", "served")
	a.moved("conclave_gateway_a2a_tasks_ended_total", 1, "state", "completed")
	if code, body := getBody(t, urlA+"/a2a/echo/.well-known/agent-card.json", ""); code != http.StatusUnauthorized {
		t.Fatalf("a card without a token: %d %s", code, body)
	}
	a.moved("conclave_gateway_a2a_calls_total", 1, "method", "AgentCard", "outcome", "refused")
	for range 2 {
		_ = send(authed(ctx), clientA, &gatewayv1.SendMessageRequest{AgentId: "echo", Content: "once", IdempotencyKey: "k1"})
	}
	a.moved("conclave_gateway_requests_total", 1, "outcome", "idempotent_repeat")

	// A request waits behind one in flight; one more finds the queue full.
	holder := startAgent(t, ctx, connA, "holder", true)
	replies := make(chan reply, 2)
	go func() {
		replies <- send(authed(ctx), clientA, &gatewayv1.SendMessageRequest{AgentId: "holder", Content: "first"})
	}()
	await(t, holder.gotOne, "the first request")
	go func() {
		replies <- send(authed(ctx), clientA, &gatewayv1.SendMessageRequest{AgentId: "holder", Content: "second"})
	}()
	a.moved("conclave_gateway_requests_queued", 1)
	if r := send(authed(ctx), clientA, &gatewayv1.SendMessageRequest{AgentId: "holder", Content: "third"}); status.Code(r.err) != codes.ResourceExhausted {
		t.Fatalf("third request: %v", r)
	}
	a.moved("conclave_gateway_requests_total", 1, "outcome", "queue_full")
	holder.done(t)
	holder.done(t)
	await(t, replies, "the first reply")
	await(t, replies, "the second reply")

	// A request through the other replica is forwarded to this one.
	if got, _ := readReply(t, authed(ctx), clientB, &gatewayv1.SendMessageRequest{AgentId: "echo", Content: "via b"}); len(got) != 2 {
		t.Fatalf("forwarded reply: %v", got)
	}
	b.moved("conclave_gateway_forwarded_requests_total", 1, "outcome", "ok")

	// A response for no request is dropped; a flood of heartbeats ends the
	// stream.
	stray := registerAgent(t, ctx, connA, "stray")
	_ = stray.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{RequestId: "nope"}}})
	a.moved("conclave_gateway_responses_dropped_total", 1)
	flood := registerAgent(t, ctx, connA, "flood")
	for range 10 {
		_ = flood.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}})
	}
	a.moved("conclave_gateway_evictions_total", 1, "reason", "heartbeat_flood")

	// An agent that says nothing is evicted after the agent timeout.
	registerAgent(t, ctx, connA, "quiet")
	a.moved("conclave_gateway_evictions_total", 1, "reason", "silent")

	// Cut off from the store past its lease, the replica's agent is taken
	// by the other replica; when the store is back, that registration is
	// lost and the stream here ended.
	taken := registerAgent(t, ctx, connA, "taken")
	go func() {
		for { // heartbeats, so that the agent timeout does not end it first
			if taken.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{}}}) != nil {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	cut.cut.Store(true)
	a.moved("conclave_gateway_lease_writes_total", 1, "outcome", "failed")
	testenv.Eventually(t, time.Minute, "the other replica taking the agent", func() bool {
		s, err := covenpb.NewCovenControlClient(connB).AgentStream(ctx)
		if err != nil {
			return false
		}
		_ = s.Send(register("taken"))
		m, err := s.Recv()
		return err == nil && m.GetWelcome() != nil
	})
	cut.cut.Store(false)
	a.moved("conclave_gateway_registrations_lost_total", 1)
	a.moved("conclave_gateway_evictions_total", 1, "reason", "lease_lost")

	// Registrations refused for a want of token where tokens are required,
	// and requests refused by the client rate limit, on a third replica.
	connC, urlC := startTuned(t, "gw-strict", shared, func(c *service.Config) {
		c.AllowAgentsWithoutTokens, c.AgentTokens = false, []string{"only=only-secret-0123456789"}
		c.ClientRate, c.ClientBurst = 1e-6, 1
	})
	c := &scraper{t: t, url: urlC, checked: checked}
	if err := refusedWith(connC, register("nobody")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent without a token: %v", err)
	}
	c.moved("conclave_gateway_registrations_total", 1, "outcome", "denied")
	clientC := gatewayv1.NewGatewayServiceClient(connC)
	for range 2 {
		_ = send(authed(ctx), clientC, &gatewayv1.SendMessageRequest{AgentId: "nobody"})
	}
	c.moved("conclave_gateway_requests_total", 1, "outcome", "rate_limited")

	// Requests refused for too many wrong tokens from one address, on a
	// fourth replica.
	connD, urlD := startTuned(t, "gw-throttled", shared, steadyThrottle)
	checkAuthThrottle(t, connD, urlD)
	(&scraper{t: t, url: urlD, checked: checked}).moved("conclave_gateway_auth_throttled_total", 3)

	// History, on a fifth replica that keeps it: items written, a repeated
	// key replayed, and writes failing while the store is cut off.
	histStore := &cuttableStore{Store: shared}
	connE, urlE := startTuned(t, "gw-history", histStore, withHistory(nil))
	e := &scraper{t: t, url: urlE, checked: checked}
	clientE := gatewayv1.NewGatewayServiceClient(connE)
	echoAgent(t, ctx, connE, "recorded")
	keyed := &gatewayv1.SendMessageRequest{AgentId: "recorded", ThreadId: "th-metrics", Content: "hi", IdempotencyKey: "k-hist"}
	for range 2 {
		if r := send(authed(ctx), clientE, keyed); r.err != nil {
			t.Fatalf("recorded request: %v", r.err)
		}
	}
	e.moved("conclave_gateway_history_writes_total", 1, "outcome", "ok")
	e.moved("conclave_gateway_history_write_duration_seconds", 1)
	e.moved("conclave_gateway_requests_total", 1, "outcome", "replayed")
	histStore.cut.Store(true)
	// The thread is known to this replica, so the exchange's one write
	// (the message with the answer) is the first store call: it fails
	// until the request's last write gives up, about 10 s later.
	if r := send(authed(ctx), clientE, &gatewayv1.SendMessageRequest{AgentId: "recorded", ThreadId: "th-metrics", Content: "lost"}); status.Code(r.err) != codes.Unavailable {
		t.Fatalf("a message the history cannot store: %v, want UNAVAILABLE", r.err)
	}
	histStore.cut.Store(false)
	e.moved("conclave_gateway_history_writes_total", 1, "outcome", "failed")

	var got []string
	for name := range checked {
		got = append(got, name)
	}
	slices.Sort(got)
	want := metricstest.DocumentedNames(t, "gateway")
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("metrics checked here %v\ndiffer from those docs/metrics.md lists %v", got, want)
	}
}

// TestGatewayMetricSeriesStayBounded floods a replica with 10,000 distinct
// agent IDs, in requests and in registrations: no label takes them in, so
// the number of series stays where it was.
func TestGatewayMetricSeriesStayBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 20,000 requests and registrations")
	}
	t.Parallel()
	ctx := context.Background()
	conn, url := startTuned(t, "gw-bounded", openStore(t), func(c *service.Config) {
		c.AllowAgentsWithoutTokens, c.AgentTokens = false, []string{"only=only-secret-0123456789"}
		c.Lease = 900 * time.Millisecond
	})
	client := gatewayv1.NewGatewayServiceClient(conn)
	// One of each outcome first, so that every label value already exists
	// (the lease's renewals too).
	(&scraper{t: t, url: url, checked: map[string]bool{}}).moved("conclave_gateway_lease_writes_total", 1, "outcome", "renewed")
	_ = send(authed(ctx), client, &gatewayv1.SendMessageRequest{AgentId: "warm"})
	if s, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx); err == nil {
		_ = s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: "warm"}}})
		_, _ = s.Recv()
	}
	before := metricstest.Scrape(t, url+"/metrics")
	const n = 10000
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id := fmt.Sprintf("distinct-%d", i)
			_ = send(authed(ctx), client, &gatewayv1.SendMessageRequest{AgentId: id})
			s, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
			if err != nil {
				return
			}
			_ = s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}})
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	after := metricstest.Scrape(t, url+"/metrics")
	if got := after.Value("conclave_gateway_requests_total", "outcome", "not_found") - before.Value("conclave_gateway_requests_total", "outcome", "not_found"); got != n {
		t.Fatalf("%v requests counted, want %d", got, n)
	}
	if got := after.Value("conclave_gateway_registrations_total", "outcome", "denied") - before.Value("conclave_gateway_registrations_total", "outcome", "denied"); got != n {
		t.Fatalf("%v refused registrations counted, want %d", got, n)
	}
	// The lease's own outcomes (a renewal that failed on a loaded machine)
	// may add a series of their own; they are not counted.
	leaseSeries := func(f metricstest.Families) int { return f.Series("conclave_gateway_lease_write") }
	if b, a := before.Series("conclave_gateway_")-leaseSeries(before), after.Series("conclave_gateway_")-leaseSeries(after); a != b {
		t.Errorf("the gateway's series went from %d to %d after %d distinct agent IDs", b, a, n)
	}
	for name, fam := range after {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "distinct-") {
					t.Errorf("%s has label %s=%q, an agent ID", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}
