package auth_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
)

func TestCheckTokens(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", auth.MinTokenLength)
	tests := []struct {
		tokens []string
		ok     bool
	}{
		{nil, true},
		{[]string{long}, true},
		{[]string{long, long + "y"}, true},
		{[]string{"q"}, false},
		{[]string{long, long[:15]}, false},
		{[]string{""}, false},
	}
	for _, tt := range tests {
		err := auth.CheckTokens("CONCLAVE_X_TOKENS", tt.tokens...)
		if (err == nil) != tt.ok {
			t.Errorf("%q: %v, want ok=%v", tt.tokens, err, tt.ok)
		}
		if err != nil {
			for _, tok := range tt.tokens {
				if len(tok) > 1 && strings.Contains(err.Error(), tok) {
					t.Errorf("the error repeats a token: %v", err)
				}
			}
			if !strings.HasPrefix(err.Error(), "CONCLAVE_X_TOKENS: ") {
				t.Errorf("the error does not name the setting: %v", err)
			}
		}
	}
	if _, err := auth.ParseAgentTokens([]string{"a=" + long[:15]}, true); err == nil || strings.Contains(err.Error(), long[:15]) {
		t.Errorf("a 15-character agent token: %v", err)
	}
	if _, err := auth.ParseAgentTokens([]string{"a=" + long}, true); err != nil {
		t.Errorf("a 16-character agent token: %v", err)
	}
}

// clock is a test's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time                         { return c.t }
func (c *clock) advance(d time.Duration)                { c.t = c.t.Add(d) }
func newClock() *clock                                  { return &clock{t: time.Unix(1700000000, 0)} }
func (c *clock) String() string                         { return c.t.String() }
func addr(ip string) string                             { return net.JoinHostPort(ip, "40000") }
func waitOf(th *auth.Throttle, ip string) time.Duration { return th.Wait(addr(ip)) }

func TestThrottle(t *testing.T) {
	t.Parallel()
	c := newClock()
	var throttled atomic.Int32
	th := auth.NewThrottle(auth.ThrottleOptions{Burst: 3, Every: 2 * time.Second, Now: c.now,
		Throttled: func(context.Context) { throttled.Add(1) }})
	for range 3 {
		if w := waitOf(th, "192.0.2.1"); w != 0 {
			t.Fatalf("throttled within the burst: %s", w)
		}
		th.Fail(addr("192.0.2.1"))
	}
	if w := waitOf(th, "192.0.2.1"); w != 2*time.Second {
		t.Errorf("after the burst: wait %s, want 2s", w)
	}
	// Another address, and the same host's other port, are told apart
	// from it by address alone.
	if w := waitOf(th, "192.0.2.2"); w != 0 {
		t.Errorf("another address waits %s", w)
	}
	if w := th.Wait("192.0.2.1:1"); w == 0 {
		t.Error("another port of the throttled address is not throttled")
	}
	// IPv6 counts by /64.
	for range 3 {
		th.Fail(addr("2001:db8:1:2::1"))
	}
	if waitOf(th, "2001:db8:1:2::ffff") == 0 || waitOf(th, "2001:db8:1:3::1") != 0 {
		t.Error("IPv6 is not throttled by /64")
	}
	// The budget grows back.
	c.advance(time.Second)
	if w := waitOf(th, "192.0.2.1"); w != time.Second {
		t.Errorf("a second later: wait %s, want 1s", w)
	}
	c.advance(time.Second)
	if w := waitOf(th, "192.0.2.1"); w != 0 {
		t.Errorf("two seconds later: wait %s, want 0", w)
	}
	// Addresses that are not IPs are never throttled.
	for range 10 {
		th.Fail("@")
	}
	if th.Wait("@") != 0 {
		t.Error("a non-IP address was throttled")
	}
}

func TestThrottleBoundsMemory(t *testing.T) {
	t.Parallel()
	c := newClock()
	th := auth.NewThrottle(auth.ThrottleOptions{Burst: 1, MaxAddresses: 100, Now: c.now})
	for i := range 1000 {
		th.Fail(addr(fmt.Sprintf("10.0.%d.%d", i/256, i%256)))
	}
	n := 0
	for i := range 1000 {
		if waitOf(th, fmt.Sprintf("10.0.%d.%d", i/256, i%256)) > 0 {
			n++
		}
	}
	if n == 0 || n > 100 {
		t.Errorf("%d addresses tracked, want 1..100", n)
	}
	// The last one failed is always tracked.
	if waitOf(th, "10.0.3.231") == 0 {
		t.Error("the newest address was evicted")
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", 1500 * time.Millisecond: "2", time.Minute: "60"} {
		if got := auth.RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%s) = %s, want %s", d, got, want)
		}
	}
}

func TestThrottleHTTP(t *testing.T) {
	t.Parallel()
	c := newClock()
	th := auth.NewThrottle(auth.ThrottleOptions{Burst: 2, Now: c.now})
	req := func(ip string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr(ip)
		return r
	}
	var nilThrottle *auth.Throttle
	if !nilThrottle.HTTP(httptest.NewRecorder(), req("192.0.2.9")) {
		t.Error("a nil Throttle refused")
	}
	th.FailHTTP(req("192.0.2.9"))
	th.FailHTTP(req("192.0.2.9"))
	w := httptest.NewRecorder()
	if th.HTTP(w, req("192.0.2.9")) || w.Header().Get("Retry-After") != "1" {
		t.Errorf("throttled address: allowed, or Retry-After %q", w.Header().Get("Retry-After"))
	}
	if !th.HTTP(httptest.NewRecorder(), req("192.0.2.10")) {
		t.Error("another address refused")
	}
}

// grpcCall is a gRPC server context from ip with an optional token.
func grpcCall(ip, token string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
	if token != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+token))
	}
	return ctx
}

func TestProtectThrottles(t *testing.T) {
	t.Parallel()
	good := strings.Repeat("g", 20)
	c := newClock()
	th := auth.NewThrottle(auth.ThrottleOptions{Burst: 5, Now: c.now})
	unary, _ := auth.NewTokens(good).WithThrottle(th).Protect("/svc.")
	info := &grpc.UnaryServerInfo{FullMethod: "/svc.S/M"}
	ok := func(context.Context, any) (any, error) { return "ran", nil }
	call := func(ip, token string) error {
		_, err := unary(grpcCall(ip, token), nil, info, ok)
		return err
	}
	// Missing tokens guess nothing and are not counted.
	for range 10 {
		if err := call("192.0.2.1", ""); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("no token: %v", err)
		}
	}
	for i := range 5 {
		if err := call("192.0.2.1", "wrong-token-xxxxxxx"); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("wrong token %d: %v", i, err)
		}
	}
	// Throttled: even the right token is refused, so a lucky guess cannot
	// tell itself apart.
	err := call("192.0.2.1", good)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("throttled right token: %v", err)
	}
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 {
		t.Errorf("no RetryInfo in %v", status.Convert(err).Details())
	}
	if err := call("192.0.2.2", good); err != nil {
		t.Errorf("another address: %v", err)
	}
	c.advance(time.Second)
	if err := call("192.0.2.1", good); err != nil {
		t.Errorf("after the wait: %v", err)
	}
}

func TestAgentTokensThrottle(t *testing.T) {
	t.Parallel()
	tok := strings.Repeat("a", 16)
	c := newClock()
	at, err := auth.ParseAgentTokens([]string{"agent-1=" + tok}, false)
	if err != nil {
		t.Fatal(err)
	}
	at.WithThrottle(auth.NewThrottle(auth.ThrottleOptions{Burst: 2, Now: c.now}))
	for range 2 {
		if err := at.Check(grpcCall("192.0.2.1", "nope-nope-nope-nope"), "agent-1"); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("wrong agent token: %v", err)
		}
	}
	if err := at.Check(grpcCall("192.0.2.1", tok), "agent-1"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("throttled agent: %v", err)
	}
	if err := at.Check(grpcCall("192.0.2.3", tok), "agent-1"); err != nil {
		t.Errorf("another address: %v", err)
	}
}

// A REST front's own calls (SelfDialOptions) pass a throttled address,
// the token still checked; a forged mark does not.
func TestThrottleSelfCalls(t *testing.T) {
	t.Parallel()
	good := strings.Repeat("g", 20)
	th := auth.NewThrottle(auth.ThrottleOptions{Burst: 1})
	unary, stream := auth.NewTokens(good).WithThrottle(th).Protect("/grpc.health.v1.")
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	dial := func(opts ...grpc.DialOption) healthpb.HealthClient {
		conn, err := grpc.NewClient(l.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	check := func(c healthpb.HealthClient, md ...string) codes.Code {
		ctx := metadata.AppendToOutgoingContext(context.Background(), md...)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	plain, self := dial(), dial(th.SelfDialOptions()...)
	if c := check(plain, "authorization", "Bearer wrong-token-0123456789"); c != codes.Unauthenticated {
		t.Fatalf("wrong token: %v", c)
	}
	if c := check(plain, "authorization", "Bearer "+good); c != codes.ResourceExhausted {
		t.Errorf("throttled address, right token: %v", c)
	}
	if c := check(plain, "authorization", "Bearer "+good, "x-conclave-throttle-self", "forged"); c != codes.ResourceExhausted {
		t.Errorf("a forged mark: %v", c)
	}
	if c := check(self, "authorization", "Bearer "+good); c != codes.OK {
		t.Errorf("the front's call: %v", c)
	}
	if c := check(self, "authorization", "Bearer wrong-token-0123456789"); c != codes.Unauthenticated {
		t.Errorf("the front's call with a wrong token: %v", c)
	}
}
