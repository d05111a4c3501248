package jsonrpc

import "log/slog"

// Option configures a Conn.
type Option func(*options)

type options struct {
	maxInflight   int
	cancelMethod  string
	cancelIDField string
	trace         bool
	logger        *slog.Logger
}

// DefaultMaxInflight is how many request handlers a connection runs at once
// unless WithMaxInflight says otherwise.
const DefaultMaxInflight = 64

// WithMaxInflight bounds how many of the peer's requests are handled at once
// (DefaultMaxInflight when n is zero or less). With that many handlers
// running, the connection stops reading until one returns, which pushes back
// on a peer sending faster than we answer. It also holds back responses to
// our own calls, so a handler that waits on a Call to its own peer should
// have a deadline, or n such handlers stop the connection until they give
// up.
//
// Answers that the peer does not read are bounded too, at 16n: beyond that
// the connection ends, as the peer has stopped reading while it keeps
// sending. Stopping reading instead would deadlock two busy peers, each
// waiting for the other to read.
func WithMaxInflight(n int) Option {
	return func(o *options) {
		if n <= 0 {
			n = DefaultMaxInflight
		}
		o.maxInflight = n
	}
}

// WithCancelMethod sets the notification that cancels a request in either
// direction, and the params member naming the request: ("$/cancelRequest",
// "id") by default as in LSP, ("$/cancel_request", "requestId") for ACP,
// ("notifications/cancelled", "requestId") for MCP. An empty method turns
// cancellation off: a cancelled Call then only stops waiting, and such
// notifications from the peer reach the Handler like any other.
func WithCancelMethod(method, idField string) Option {
	return func(o *options) { o.cancelMethod, o.cancelIDField = method, idField }
}

// WithTracePropagation turns on or off carrying W3C trace context in
// params._meta (on by default): injecting it into the params of outgoing
// requests whose context has a span, and extracting it into the context of
// handlers.
func WithTracePropagation(enabled bool) Option {
	return func(o *options) { o.trace = enabled }
}

// WithLogger sets where the connection reports what it cannot return to
// anyone: handler panics, failed notification handlers, responses nobody
// waits for. The default is slog.Default(); nil discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		o.logger = l
	}
}
