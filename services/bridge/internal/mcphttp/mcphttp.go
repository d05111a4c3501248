// Package mcphttp is the HTTP layer in front of the bridge's MCP endpoint:
// bearer-token authentication, the throttle of wrong tokens, a rate limit
// per client, and the bridge's one HTTP error shape, MCP's own.
package mcphttp

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/conclave-ai/conclave/pkg/auth"
)

// WriteHTTPError writes the bridge's one HTTP error shape, MCP's own: a
// JSON-RPC error response without an id, as the MCP specification allows
// a streamable HTTP server to answer what it cannot accept, with the HTTP
// status beside it. The code is -32603 (Internal error) for a 5xx and
// -32600 (Invalid Request) for every other status: the request as sent
// cannot be taken. pkg/server writes its own errors (unknown path, body
// over the limit, a panic, draining) with it too.
func WriteHTTPError(w http.ResponseWriter, status int, message string) {
	code := -32600
	if status >= 500 {
		code = -32603
	}
	body, _ := json.Marshal(rpcError{JSONRPC: "2.0", Error: rpcErrorDetail{Code: code, Message: message}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// rpcError is a JSON-RPC 2.0 error response; ID is always null, since a
// transport error belongs to no request the server read.
type rpcError struct {
	JSONRPC string         `json:"jsonrpc"`
	ID      *int           `json:"id"`
	Error   rpcErrorDetail `json:"error"`
}

type rpcErrorDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// maxErrorText bounds the text of a transport error kept for its JSON-RPC
// form.
const maxErrorText = 4 << 10

// JSONRPCErrors answers h's plain-text errors (the MCP SDK's transport
// writes them with http.Error: a wrong method, Content-Type or Accept, an
// unknown session, a body it cannot parse) as JSON-RPC errors in
// WriteHTTPError's shape; everything else, its SSE streams and JSON-RPC
// answers included, passes through untouched.
func JSONRPCErrors(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pw := &plainErrors{ResponseWriter: w}
		h.ServeHTTP(pw, r)
		if pw.status != 0 {
			if pw.status == http.StatusMethodNotAllowed {
				w.Header().Set("Allow", "GET, POST, DELETE")
			}
			WriteHTTPError(w, pw.status, strings.TrimSpace(pw.text.String()))
		}
	})
}

// plainErrors holds back a plain-text error response for JSONRPCErrors.
type plainErrors struct {
	http.ResponseWriter
	status  int  // the held-back error's status, 0 when none
	passing bool // the response is not one: it goes through as written
	text    bytes.Buffer
}

func (w *plainErrors) WriteHeader(code int) {
	switch {
	case w.passing || w.status != 0:
	case code >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain"):
		w.status = code
		return
	case code < 200:
		// Interim (1xx): the real status follows.
	default:
		w.passing = true
	}
	if w.status == 0 {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *plainErrors) Write(p []byte) (int, error) {
	if !w.passing && w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.status != 0 {
		if room := maxErrorText - w.text.Len(); room > 0 {
			w.text.Write(p[:min(len(p), room)])
		}
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Flush passes through, except for a held-back error: SSE streams need it.
func (w *plainErrors) Flush() {
	if w.status == 0 {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

func (w *plainErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// GuardSettings are Guard's: CONCLAVE_BRIDGE_TOKENS, _RATE, _BURST and
// _ALLOW_UNAUTHENTICATED.
type GuardSettings struct {
	Tokens               []string
	Rate                 float64
	Burst                int
	AllowUnauthenticated bool
}

// Guard puts bearer-token authentication (unless cfg allows none), the
// throttle of wrong tokens per address and a per-client rate limit in
// front of h. Failures answer in the bridge's error shape, WriteHTTPError.
func Guard(cfg GuardSettings, throttle *auth.Throttle, h http.Handler) http.Handler {
	tokens := auth.NewTokens(cfg.Tokens...)
	limits := &clientLimits{rate: rate.Limit(cfg.Rate), burst: cfg.Burst, clients: map[string]*clientLimit{}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := ""
		token, presented := auth.Bearer(r.Header.Get("Authorization"))
		if presented && !cfg.AllowUnauthenticated {
			if !throttle.HTTP(w, r) {
				WriteHTTPError(w, http.StatusTooManyRequests, auth.ThrottledMessage)
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
			WriteHTTPError(w, http.StatusUnauthorized, "missing or invalid bearer token: send Authorization: Bearer <token> (CONCLAVE_BRIDGE_TOKENS)")
			return
		} else if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			client = "addr:" + host
		}
		if !limits.allow(client) {
			w.Header().Set("Retry-After", "1")
			WriteHTTPError(w, http.StatusTooManyRequests, "rate limit exceeded (CONCLAVE_BRIDGE_RATE); retry later")
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
