package clientapi

import (
	"context"
	"strings"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
)

// RateLimits bound what one client (one bearer token, or every caller
// together on a server without tokens) may ask of one replica.
type RateLimits struct {
	// Rate is the sustained requests per second, every method counted.
	Rate float64
	// Burst is how many requests may come at once.
	Burst int
	// Streams is how many streams (SendMessage, WatchThread) may be open
	// at once.
	Streams int
}

// DefaultRateLimits apply to the zero fields of a RateLimits.
var DefaultRateLimits = RateLimits{Rate: 50, Burst: 100, Streams: 64}

func (l RateLimits) withDefaults() RateLimits {
	if l.Rate <= 0 {
		l.Rate = DefaultRateLimits.Rate
	}
	if l.Burst <= 0 {
		l.Burst = DefaultRateLimits.Burst
	}
	if l.Streams <= 0 {
		l.Streams = DefaultRateLimits.Streams
	}
	return l
}

// Limiter keeps one token bucket and one count of open streams
// per client, as auth.ClientID names it.
//
// Its map is never pruned, and needs not be: an identity exists only for a
// bearer token the server accepted (auth.Protect checks it before these
// interceptors run, and an unchecked token is auth.Anonymous), so there are
// at most as many entries as configured tokens, plus one.
//
// Requests forwarded from another replica are counted here as well: no
// replica can prove to another that it already counted a request, so the
// forwarding header cannot exempt one. A forwarded request costs one token
// (and, for SendMessage, one stream) on each replica it passes.
type Limiter struct {
	limits RateLimits

	mu      sync.Mutex
	clients map[string]*clientState
}

type clientState struct {
	bucket  *rate.Limiter
	streams int // guarded by Limiter.mu
}

// NewLimiter returns a Limiter; zero fields of limits take
// DefaultRateLimits.
func NewLimiter(limits RateLimits) *Limiter {
	return &Limiter{limits: limits.withDefaults(), clients: map[string]*clientState{}}
}

// Limits returns the limits in force, defaults applied.
func (l *Limiter) Limits() RateLimits { return l.limits }

func (l *Limiter) client(id string) *clientState {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.clients[id]
	if !ok {
		c = &clientState{bucket: rate.NewLimiter(rate.Limit(l.limits.Rate), l.limits.Burst)}
		l.clients[id] = c
	}
	return c
}

// allow takes one token from the caller's bucket, or fails with
// RESOURCE_EXHAUSTED (HTTP 429 through grpc-gateway).
func (l *Limiter) allow(ctx context.Context) (*clientState, error) {
	c := l.client(auth.ClientID(ctx))
	if !c.bucket.Allow() {
		return nil, status.Errorf(codes.ResourceExhausted,
			"client rate limit of %g requests/s (burst %d) exceeded; retry later", l.limits.Rate, l.limits.Burst)
	}
	return c, nil
}

// openStream counts one more open stream for c, or fails with
// RESOURCE_EXHAUSTED; the returned func closes it.
func (l *Limiter) openStream(c *clientState) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.streams >= l.limits.Streams {
		return nil, status.Errorf(codes.ResourceExhausted,
			"client limit of %d concurrent streams (SendMessage, WatchThread) exceeded; retry later", l.limits.Streams)
	}
	c.streams++
	return func() {
		l.mu.Lock()
		c.streams--
		l.mu.Unlock()
	}, nil
}

// ServicePrefix starts the full name of every GatewayService method: what
// authentication and the limits guard.
var ServicePrefix = "/" + gatewayv1.GatewayService_ServiceDesc.ServiceName + "/"

// Interceptors apply the limits to every GatewayService method, counting
// refused SendMessage requests in m. Install them after authentication, so
// that only accepted callers spend tokens and every caller is named by its
// own token.
func (l *Limiter) Interceptors(m *metrics.Metrics) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, ServicePrefix) {
			if _, err := l.allow(ctx); err != nil {
				return nil, err
			}
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, ServicePrefix) {
			return h(srv, ss)
		}
		send := info.FullMethod == gatewayv1.GatewayService_SendMessage_FullMethodName
		c, err := l.allow(ss.Context())
		if err != nil {
			if send {
				m.Request(metrics.RateLimited)
			}
			return err
		}
		// A stream lasts as long as an agent works (SendMessage holds a
		// place in its queue), so open ones are counted too.
		done, err := l.openStream(c)
		if err != nil {
			if send {
				m.Request(metrics.RateLimited)
			}
			return err
		}
		defer done()
		return h(srv, ss)
	}
	return unary, stream
}
