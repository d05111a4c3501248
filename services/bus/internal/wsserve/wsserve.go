// Package wsserve serves the bus's clients: it authenticates a request's
// bearer token (for the WebSocket endpoint and the admin API alike) and
// turns an accepted WebSocket into a broker session on a JSON-RPC
// connection, which it closes with 1001 when the server drains.
package wsserve

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
	"github.com/conclave-ai/conclave/services/bus/internal/wsconn"
)

// Auth resolves the bearer tokens of the bus's HTTP requests.
type Auth struct {
	// Open lets every request through without a token, with every
	// permission (CONCLAVE_BUS_ALLOW_UNAUTHENTICATED).
	Open   bool
	Access *broker.Access
	// Broker checks the tokens the default handler minted for the agents
	// it launched.
	Broker *broker.Broker
	// Throttle counts wrong tokens per address, the peers' included.
	Throttle *auth.Throttle
	Logger   *slog.Logger
}

// errThrottled: the caller's address presented too many wrong tokens.
var errThrottled = errors.New(auth.ThrottledMessage)

// errTokenUncheckable: the store that holds launched agents' tokens did
// not answer; the client should retry, not treat its token as refused.
var errTokenUncheckable = errors.New("the token cannot be checked now; retry")

// Authenticate resolves the bearer token of a request, if it has one.
// present is false without an Authorization header. A wrong token counts
// against the caller's address; once it presented too many, err is
// errThrottled (and Retry-After is set) whatever the token.
func (a *Auth) Authenticate(w http.ResponseWriter, r *http.Request) (grant *broker.Grant, present bool, err error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, false, nil
	}
	if !a.Throttle.HTTP(w, r) {
		return nil, true, errThrottled
	}
	token, ok := auth.Bearer(h)
	if !ok {
		a.Throttle.FailHTTP(r)
		return nil, true, errors.New("the Authorization header is not a bearer token")
	}
	g, err := a.Access.Lookup(token)
	if errors.Is(err, broker.ErrUnknownToken) {
		// A token the default handler minted for an agent it launched.
		g, err = a.Broker.LaunchGrant(r.Context(), token)
		if err != nil && !errors.Is(err, broker.ErrUnknownToken) {
			a.Logger.WarnContext(r.Context(), "bus: checking a launched agent's token", "error", err)
			return nil, true, errTokenUncheckable
		}
	}
	if err != nil {
		if !errors.Is(err, errTokenUncheckable) {
			a.Throttle.FailHTTP(r)
		}
		return nil, true, err
	}
	return &g, true, nil
}

// Admin lets through only requests with an admin's token (any request,
// when the bus is open).
func (a *Auth) Admin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Open {
			grant, present, err := a.Authenticate(w, r)
			switch {
			case !present:
				server.WriteError(w, http.StatusUnauthorized, "bus: a bearer token is required")
				return
			case err != nil:
				writeAuthError(w, err)
				return
			case !grant.Admin:
				server.WriteError(w, http.StatusForbidden, "bus: this token is not an admin's")
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// writeAuthError answers a failed authentication: 503 when the token could
// not be checked, 429 when its address is throttled, 401 when it was
// refused.
func writeAuthError(w http.ResponseWriter, err error) {
	if errors.Is(err, errThrottled) {
		server.WriteError(w, http.StatusTooManyRequests, "bus: "+err.Error())
		return
	}
	if errors.Is(err, errTokenUncheckable) {
		w.Header().Set("Retry-After", "1")
		server.WriteError(w, http.StatusServiceUnavailable, "bus: "+err.Error())
		return
	}
	server.WriteError(w, http.StatusUnauthorized, "bus: "+err.Error())
}

// Limits bound one client connection.
type Limits struct {
	MaxFrameBytes  int
	OutboundBuffer int
	WriteTimeout   time.Duration
	MaxInflight    int
}

// Handler is the bus's WebSocket endpoint.
type Handler struct {
	auth   *Auth
	broker *broker.Broker
	limits Limits
	log    *slog.Logger

	// conns are the open client connections, closed with 1001 when the
	// server drains: no goroutine per connection waits for that.
	connsMu  sync.Mutex
	conns    map[*jsonrpc.Conn]*wsconn.Stream
	draining bool
}

// NewHandler serves b's sessions to the clients a lets in.
func NewHandler(a *Auth, b *broker.Broker, limits Limits, logger *slog.Logger) *Handler {
	return &Handler{auth: a, broker: b, limits: limits, log: logger, conns: map[*jsonrpc.Conn]*wsconn.Stream{}}
}

// ServeHTTP authenticates the request, accepts its WebSocket and attaches
// a broker session to it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := h.auth
	sessionAuth := broker.SessionAuth{Open: a.Open, Access: a.Access, Throttle: a.Throttle, Remote: r.RemoteAddr}
	if !a.Open {
		grant, _, err := a.Authenticate(w, r)
		if err != nil {
			writeAuthError(w, err)
			return
		}
		sessionAuth.Grant = grant
	}
	session := h.broker.NewSession(sessionAuth)
	var conn *jsonrpc.Conn
	stream, err := wsconn.Accept(w, r, wsconn.Options{MaxFrame: h.limits.MaxFrameBytes, Buffered: h.limits.OutboundBuffer,
		WriteTimeout: h.limits.WriteTimeout, OnClose: func() {
			session.Close()
			h.connsMu.Lock()
			delete(h.conns, conn)
			h.connsMu.Unlock()
		}})
	if err != nil {
		session.Close()
		return // Accept has answered the request
	}
	// The handler returns once the connection is set up, which ends the
	// HTTP request and frees what net/http held for it: the connection
	// lives on in its JSON-RPC read loop alone.
	h.connsMu.Lock()
	conn = jsonrpc.NewConn(stream, session, jsonrpc.WithMaxInflight(h.limits.MaxInflight), jsonrpc.WithLogger(h.log))
	session.Attach(conn)
	draining := h.draining
	if !draining {
		h.conns[conn] = stream
	}
	h.connsMu.Unlock()
	if draining {
		goAway(conn, stream)
	}
}

// goAway tells a client the bus is shutting down, so that it reconnects
// elsewhere.
func goAway(conn *jsonrpc.Conn, stream *wsconn.Stream) {
	stream.CloseWith(wsconn.StatusGoingAway, "the bus is shutting down")
	_ = conn.Close()
}

// CloseConnections closes every client connection as the server drains,
// and every one accepted after it.
func (h *Handler) CloseConnections(context.Context) {
	h.connsMu.Lock()
	h.draining = true
	conns := h.conns
	h.conns = map[*jsonrpc.Conn]*wsconn.Stream{}
	h.connsMu.Unlock()
	for conn, stream := range conns {
		goAway(conn, stream)
	}
}
