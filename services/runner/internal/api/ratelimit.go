package api

import (
	"context"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/conclave-ai/conclave/pkg/auth"
)

// RateLimiter keeps one token bucket per client (auth.ClientID: an accepted
// bearer token, or every caller together without tokens). Its map holds at
// most the configured tokens plus one, so it is never pruned.
type RateLimiter struct {
	rate  rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// NewRateLimiter allows each client perSecond requests, burst at once.
func NewRateLimiter(perSecond float64, burst int) *RateLimiter {
	return &RateLimiter{rate: rate.Limit(perSecond), burst: burst, buckets: map[string]*rate.Limiter{}}
}

func (l *RateLimiter) allow(ctx context.Context) error {
	id := auth.ClientID(ctx)
	l.mu.Lock()
	b := l.buckets[id]
	if b == nil {
		b = rate.NewLimiter(l.rate, l.burst)
		l.buckets[id] = b
	}
	l.mu.Unlock()
	if !b.Allow() {
		return apiError(codes.ResourceExhausted, "rate_limited", "too many requests", "slow down and retry")
	}
	return nil
}

// Interceptors apply the limit to every call, after authentication.
func (l *RateLimiter) Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := l.allow(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}, func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := l.allow(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}
}
