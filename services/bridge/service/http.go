package service

import (
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/server"
)

// guard puts bearer-token authentication (unless cfg allows none), the
// throttle of wrong tokens per address and a per-client rate limit in
// front of h. Failures answer in the JSON error shape of every Conclave
// HTTP surface.
func guard(cfg Config, throttle *auth.Throttle, h http.Handler) http.Handler {
	tokens := auth.NewTokens(cfg.Tokens...)
	limits := &clientLimits{rate: rate.Limit(cfg.Rate), burst: cfg.Burst, clients: map[string]*clientLimit{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := ""
		token, presented := auth.Bearer(r.Header.Get("Authorization"))
		if presented && !cfg.AllowUnauthenticated {
			if !throttle.HTTP(w, r) {
				server.WriteError(w, http.StatusTooManyRequests, auth.ThrottledMessage)
				return
			}
			if !tokens.Valid(token) {
				throttle.FailHTTP(r)
			}
		}
		if presented && tokens.Valid(token) {
			client = auth.TokenID(token)
		} else if !cfg.AllowUnauthenticated {
			w.Header().Set("WWW-Authenticate", `Bearer realm="conclave-bridge"`)
			server.WriteError(w, http.StatusUnauthorized, "missing or invalid bearer token: send Authorization: Bearer <token> (CONCLAVE_BRIDGE_TOKENS)")
			return
		} else if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			client = "addr:" + host
		}
		if !limits.allow(client) {
			w.Header().Set("Retry-After", "1")
			server.WriteError(w, http.StatusTooManyRequests, "rate limit exceeded (CONCLAVE_BRIDGE_RATE); retry later")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// clientLimits is a token bucket per client; buckets idle for a while are
// forgotten so that the map stays as small as the set of active clients.
type clientLimits struct {
	rate  rate.Limit
	burst int

	mu      sync.Mutex
	clients map[string]*clientLimit
	swept   time.Time
}

type clientLimit struct {
	limiter *rate.Limiter
	seen    time.Time
}

const idleClient = 10 * time.Minute

func (l *clientLimits) allow(client string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > idleClient {
		for k, c := range l.clients {
			if now.Sub(c.seen) > idleClient {
				delete(l.clients, k)
			}
		}
		l.swept = now
	}
	c, ok := l.clients[client]
	if !ok {
		c = &clientLimit{limiter: rate.NewLimiter(l.rate, l.burst)}
		l.clients[client] = c
	}
	c.seen = now
	return c.limiter.AllowN(now, 1)
}
