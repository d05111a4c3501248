package jsonrpc

import "context"

// Handler answers the peer's requests and notifications.
//
// Requests are handled concurrently, each on its own goroutine (unless an
// AsyncHandler takes it), so a handler may take as long as it needs; its ctx ends when the peer cancels the
// request or the connection closes. Notifications are handled one at a time
// in arrival order, on the goroutine that reads the connection, so that
// streamed updates stay in order; a notification handler that needs to wait
// (for example on a Call to the same peer) must hand the work to a goroutine,
// since no response can be read until it returns.
//
// The result is encoded with encoding/json, or sent as is if it is a
// json.RawMessage. An *Error is sent as is; any other error is sent as
// InternalError with the error's text. The result and error of a
// notification are dropped, as the spec requires.
type Handler interface {
	Handle(ctx context.Context, req *Request) (result any, err error)
}

// AsyncHandler is a Handler that can take requests without a goroutine of
// their own, answering when it is ready from whatever goroutine it is on:
// a request whose answer comes from another connection (the bus waiting
// for a subscriber) then costs no goroutine, and no wake-up of one.
type AsyncHandler interface {
	Handler
	// HandleAsync is called, for each of the peer's calls (notifications
	// excluded), on the goroutine that reads the connection. It either
	// returns false, and the call goes to Handle on its own goroutine, or
	// takes the call and returns true, and then calls reply exactly once,
	// before returning or later, from any goroutine. reply writes the
	// response on the goroutine that calls it. HandleAsync must not block:
	// no frame is read while it runs. ctx is the call's, as Handle's would
	// be; it ends when reply is called.
	HandleAsync(ctx context.Context, req *Request, reply func(result any, err error)) bool
}

// Inline returns a handler that runs h on the goroutine that reads the
// connection and answers as soon as it returns: no goroutine per call, and
// none woken. Only for handlers that are quick and never block, a Call to
// the same peer above all, since no frame is read while they run; their
// calls are answered in arrival order.
func Inline(h Handler) AsyncHandler { return inlineHandler{h} }

type inlineHandler struct{ Handler }

func (h inlineHandler) HandleAsync(ctx context.Context, req *Request, reply func(any, error)) bool {
	reply(h.Handle(ctx, req))
	return true
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req *Request) (any, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, req *Request) (any, error) { return f(ctx, req) }

// Methods is a Handler that dispatches on the method name and answers
// unknown methods with MethodNotFound.
type Methods map[string]HandlerFunc

// Handle calls the handler registered for req.Method.
func (m Methods) Handle(ctx context.Context, req *Request) (any, error) {
	h, ok := m[req.Method]
	if !ok {
		return nil, &Error{Code: MethodNotFound, Message: "Method not found: " + req.Method}
	}
	return h(ctx, req)
}

type connKey struct{}

// ConnFromContext returns the connection whose handler was given ctx, so a
// handler can call back the peer that called it. The Handler is fixed before
// the connection exists, so it cannot hold it any other way without racing
// the first request.
func ConnFromContext(ctx context.Context) (*Conn, bool) {
	c, ok := ctx.Value(connKey{}).(*Conn)
	return c, ok
}
