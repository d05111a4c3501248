package clientapi_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/internal/clientapi"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
)

const servicePrefix = "/conclave.gateway.v1.GatewayService/"

// chain runs the interceptors as service.New installs them: authentication
// first, then the limits.
type chain struct {
	authU, limU grpc.UnaryServerInterceptor
	authS, limS grpc.StreamServerInterceptor
}

func newChain(limits clientapi.RateLimits, tokens ...string) chain {
	var c chain
	c.authU, c.authS = auth.NewTokens(tokens...).Protect(servicePrefix)
	c.limU, c.limS = clientapi.NewLimiter(limits).Interceptors(metrics.Discard())
	return c
}

func withToken(tok string) context.Context {
	ctx := context.Background()
	if tok != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok))
	}
	return ctx
}

func (c chain) unary(tok, method string) error {
	info := &grpc.UnaryServerInfo{FullMethod: method}
	_, err := c.authU(withToken(tok), nil, info, func(ctx context.Context, req any) (any, error) {
		return c.limU(ctx, req, info, func(context.Context, any) (any, error) { return "ok", nil })
	})
	return err
}

// stream runs a SendMessage whose handler runs body.
func (c chain) stream(tok string, body func() error) error {
	info := &grpc.StreamServerInfo{FullMethod: gatewayv1.GatewayService_SendMessage_FullMethodName, IsServerStream: true}
	return c.authS(nil, serverStream{ctx: withToken(tok)}, info, func(srv any, ss grpc.ServerStream) error {
		return c.limS(srv, ss, info, func(any, grpc.ServerStream) error { return body() })
	})
}

type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s serverStream) Context() context.Context { return s.ctx }

func TestRateLimitPerClient(t *testing.T) {
	t.Parallel()
	// A rate this low refills nothing while the test runs: only the burst
	// counts.
	c := newChain(clientapi.RateLimits{Rate: 1e-9, Burst: 2, Streams: 8}, "alpha", "beta")
	list := servicePrefix + "ListAgents"
	steps := []struct {
		name   string
		token  string
		method string
		want   codes.Code
	}{
		{"alpha's first", "alpha", list, codes.OK},
		{"alpha's second", "alpha", servicePrefix + "GetAgent", codes.OK},
		{"alpha over its burst", "alpha", list, codes.ResourceExhausted},
		{"alpha's stream is counted too", "alpha", "stream", codes.ResourceExhausted},
		{"beta has a bucket of its own", "beta", list, codes.OK},
		{"beta's stream", "beta", "stream", codes.OK},
		{"beta over its burst", "beta", list, codes.ResourceExhausted},
		{"a wrong token is refused before any bucket", "gamma", list, codes.Unauthenticated},
		{"other services are not limited", "alpha", "/grpc.health.v1.Health/Check", codes.OK},
	}
	// In order: each step spends the buckets the next ones see.
	for _, s := range steps {
		var err error
		if s.method == "stream" {
			err = c.stream(s.token, func() error { return nil })
		} else {
			err = c.unary(s.token, s.method)
		}
		if got := status.Code(err); got != s.want {
			t.Fatalf("%s: %v, want %v", s.name, err, s.want)
		}
		if s.want == codes.ResourceExhausted && !strings.Contains(status.Convert(err).Message(), "rate limit of 1e-09 requests/s (burst 2)") {
			t.Errorf("%s: message %q does not name the limit", s.name, status.Convert(err).Message())
		}
	}
}

func TestRateLimitAnonymousShareOneBucket(t *testing.T) {
	t.Parallel()
	// Without authentication (no Protect), a token is never checked, so it
	// names no one: every caller is auth.Anonymous and the limiter's map
	// cannot grow with made-up tokens.
	unary, _ := clientapi.NewLimiter(clientapi.RateLimits{Rate: 1e-9, Burst: 2, Streams: 1}).Interceptors(metrics.Discard())
	info := &grpc.UnaryServerInfo{FullMethod: servicePrefix + "ListAgents"}
	ok := func(context.Context, any) (any, error) { return nil, nil }
	for i, tok := range []string{"made-up-1", "made-up-2", "made-up-3"} {
		_, err := unary(withToken(tok), nil, info, ok)
		want := codes.OK
		if i == 2 {
			want = codes.ResourceExhausted
		}
		if status.Code(err) != want {
			t.Fatalf("call %d with token %q: %v, want %v", i, tok, err, want)
		}
	}
}

func TestConcurrentStreamCap(t *testing.T) {
	t.Parallel()
	c := newChain(clientapi.RateLimits{Rate: 1e9, Burst: 1000, Streams: 2}, "alpha", "beta")
	release := make(chan struct{})
	var wg sync.WaitGroup
	started := make(chan struct{})
	errs := make(chan error, 3)
	defer func() {
		select {
		case <-release:
		default:
			close(release) // on failure, let the open streams end
		}
	}()
	// open starts a stream that stays open until release is closed.
	open := func(tok string) {
		t.Helper()
		refused := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.stream(tok, func() error { started <- struct{}{}; <-release; return nil })
			if err != nil {
				refused <- err
			}
			errs <- err
		}()
		select {
		case <-started:
		case err := <-refused:
			t.Fatalf("%s's stream within the cap: %v", tok, err)
		}
	}
	open("alpha")
	open("alpha")
	err := c.stream("alpha", func() error { return nil })
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "2 concurrent streams (SendMessage, WatchThread)") {
		t.Fatalf("alpha's third stream: %v, want RESOURCE_EXHAUSTED naming the cap", err)
	}
	// Unary calls are not streams.
	if err := c.unary("alpha", servicePrefix+"ListAgents"); err != nil {
		t.Fatalf("alpha's unary call while at the stream cap: %v", err)
	}
	// Another client has streams of its own.
	open("beta")
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a stream within the cap: %v", err)
		}
	}
	// Ended streams give their places back.
	if err := c.stream("alpha", func() error { return nil }); err != nil {
		t.Fatalf("alpha's stream after the others ended: %v", err)
	}
}

func TestRateLimitDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want clientapi.RateLimits
	}{
		{clientapi.RateLimits{}, clientapi.DefaultRateLimits},
		{clientapi.RateLimits{Rate: 2}, clientapi.RateLimits{Rate: 2, Burst: 100, Streams: 64}},
		{clientapi.RateLimits{Rate: 0.5, Burst: 1, Streams: 3}, clientapi.RateLimits{Rate: 0.5, Burst: 1, Streams: 3}},
	}
	for _, tt := range tests {
		if got := clientapi.NewLimiter(tt.in).Limits(); got != tt.want {
			t.Errorf("NewLimiter(%+v).Limits() = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}
