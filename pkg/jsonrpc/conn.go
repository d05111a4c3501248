package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/conclave-ai/conclave/pkg/jsonscan"
)

// ErrClosed is wrapped by every error that reports the end of a connection:
// Err, and the errors of calls it left unanswered.
var ErrClosed = errors.New("jsonrpc: connection closed")

// errCancelledByPeer is the cause of a handler's context when the peer
// cancelled the request, which the handler's error is then reported as.
var errCancelledByPeer = errors.New("jsonrpc: request cancelled by the peer")

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

// Conn is a JSON-RPC 2.0 connection on which both ends may send requests.
// Its methods are safe for concurrent use.
type Conn struct {
	stream  Stream
	handler Handler
	opts    options

	// ctx is the parent of every handler's context, and ends with the
	// connection.
	ctx    context.Context
	cancel context.CancelFunc

	// slots holds one token per running request handler.
	slots chan struct{}
	// unsent counts replies decided on but not yet written.
	unsent atomic.Int64
	seq    atomic.Int64

	mu      sync.Mutex
	pending map[int64]pendingCall // our calls awaiting a response
	closed  bool                  // set once shutdown has failed the calls made with Go
	// inflight holds the peer's calls being handled: the first in one
	// inline slot, any others in a map, nil while there are none, so that
	// neither one call at a time nor an idle connection costs a map.
	inflight inflightCalls

	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
	err       error // why the connection ended; written before done is closed
}

// pendingCall is where the response to one of our calls goes: to ch, for
// Wait, or to done, for a call made with Go.
type pendingCall struct {
	ch   chan callResult
	done func(result json.RawMessage, err error)
}

// callResult is what a pending call receives.
type callResult struct {
	result json.RawMessage
	err    error
}

// NewConn starts a connection over s, answering the peer with h; a nil h
// answers every request with MethodNotFound. The connection reads from s
// until s fails or Close is called.
func NewConn(s Stream, h Handler, opts ...Option) *Conn {
	o := options{
		maxInflight:   DefaultMaxInflight,
		cancelMethod:  "$/cancelRequest",
		cancelIDField: "id",
		trace:         true,
		logger:        slog.Default(),
	}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Conn{
		stream:  s,
		handler: h,
		opts:    o,
		slots:   make(chan struct{}, o.maxInflight),
		pending: make(map[int64]pendingCall),
		done:    make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx, c.cancel = context.WithValue(ctx, connKey{}, c), cancel
	go c.readLoop()
	return c
}

// Call sends a request and waits for its response, decoding the result into
// result unless result is nil. Params must encode to a JSON object or array,
// or be nil. A JSON-RPC error from the peer is returned as an *Error.
//
// If ctx ends first, Call returns ctx.Err() at once and tells the peer with
// the cancel notification (see WithCancelMethod). If the connection ends
// first, it returns an error wrapping ErrClosed.
func (c *Conn) Call(ctx context.Context, method string, params, result any) error {
	p, err := c.start(ctx, method, params)
	if err != nil {
		return err
	}
	return p.Wait(ctx, result)
}

// PendingCall is a request sent with Start whose response has not been
// waited for yet, or one sent with Go.
type PendingCall struct {
	c      *Conn
	id     int64
	method string
	ch     chan callResult              // Start's
	done   func(json.RawMessage, error) // Go's
}

// Start sends a request, as Call does, but returns once it is written:
// Wait then waits for the response. A caller can so have requests out to
// many peers at once without a goroutine for each. ctx bounds the write;
// its trace context travels with the request.
func (c *Conn) Start(ctx context.Context, method string, params any) (*PendingCall, error) {
	p, err := c.start(ctx, method, params)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// Go sends a request, as Start does, and calls done with its raw result
// or its error, instead of leaving them to Wait: so a caller can wait for
// many answers, or go on when one comes, without a goroutine waiting.
// done runs once, on the goroutine that reads the connection when the
// response arrives, on the one ending the connection, or on Abandon's; it
// must not block, as no other response is read while it runs. If Go
// returns an error, done is never called.
func (c *Conn) Go(ctx context.Context, method string, params any, done func(result json.RawMessage, err error)) (*PendingCall, error) {
	p, err := c.startWith(ctx, method, params, nil, done)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// GoDeferred is Go, except that when the stream is a QueueingStream the
// request is only queued: it goes out with the next Flush of this
// connection (or with any write to it before), together with whatever
// else was queued for the peer meanwhile. A fan-out so writes each peer
// once for all the requests that queued up while it went round.
func (c *Conn) GoDeferred(ctx context.Context, method string, params any, done func(result json.RawMessage, err error)) (*PendingCall, error) {
	qs, _ := c.stream.(QueueingStream)
	p, err := c.startWith(ctx, method, params, qs, done)
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// Abandon stops waiting for the response to a call made with Go: unless
// the response came first, done is called at once with err, and the peer
// is told with the cancel notification (see WithCancelMethod).
func (p *PendingCall) Abandon(err error) {
	c := p.c
	if !c.forget(p.id) {
		return
	}
	if c.opts.cancelMethod != "" {
		go c.sendCancel(p.id)
	}
	p.done(nil, err)
}

// Flush writes what GoDeferred queued, unless a write under way does.
// A write failure ends the connection.
func (c *Conn) Flush() error {
	qs, ok := c.stream.(QueueingStream)
	if !ok {
		return nil
	}
	if err := qs.Flush(); err != nil {
		c.shutdown(fmt.Errorf("writing: %w", err))
		return c.err
	}
	return nil
}

// start is Start without the allocation of a PendingCall that Call does
// not need.
func (c *Conn) start(ctx context.Context, method string, params any) (PendingCall, error) {
	return c.startWith(ctx, method, params, nil, nil)
}

// startWith sends a request, queued on qs when it is not nil, whose
// response goes to done when it is not nil.
func (c *Conn) startWith(ctx context.Context, method string, params any, qs QueueingStream, done func(json.RawMessage, error)) (PendingCall, error) {
	id := c.seq.Add(1)
	frame, err := c.encodeRequest(ctx, Int64ID(id), method, params)
	if err != nil {
		return PendingCall{}, err
	}
	p := PendingCall{c: c, id: id, method: method, done: done}
	if done == nil {
		p.ch = make(chan callResult, 1)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return PendingCall{}, c.err
	}
	c.pending[id] = pendingCall{ch: p.ch, done: done}
	c.mu.Unlock()

	if err := c.writeWith(ctx, frame, qs); err != nil {
		if !c.forget(id) && done != nil {
			return p, nil // the connection ended meanwhile, and told done
		}
		return PendingCall{}, err
	}
	return p, nil
}

// Wait waits for the response of the call and decodes its result into
// result unless result is nil, as Call does. It may be called once.
func (p *PendingCall) Wait(ctx context.Context, result any) error {
	c := p.c
	select {
	case r := <-p.ch:
		if r.err != nil {
			return r.err
		}
		if result != nil {
			if err := json.Unmarshal(r.result, result); err != nil {
				return fmt.Errorf("jsonrpc: decoding the result of %s: %w", p.method, err)
			}
		}
		return nil
	case <-ctx.Done():
		if c.forget(p.id) && c.opts.cancelMethod != "" {
			go c.sendCancel(p.id)
		}
		return ctx.Err()
	case <-c.done:
		return c.err
	}
}

// forget drops a pending call, reporting whether it was still pending.
func (c *Conn) forget(id int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.pending[id]
	delete(c.pending, id)
	return ok
}

func (c *Conn) sendCancel(id int64) {
	params := make([]byte, 0, 32)
	params = append(params, '{')
	params = appendString(params, c.opts.cancelIDField)
	params = append(params, ':')
	params = appendID(params, Int64ID(id))
	params = append(params, '}')
	frame := appendRequest(nil, &Request{Method: c.opts.cancelMethod, Params: params})
	if err := c.write(c.ctx, frame); err != nil {
		c.opts.logger.Debug("jsonrpc: sending cancellation", "id", id, "error", err)
	}
}

// Notify sends a notification. It returns once the notification is written,
// which does not mean the peer has handled it.
func (c *Conn) Notify(ctx context.Context, method string, params any) error {
	frame, err := c.encodeRequest(ctx, ID{}, method, params)
	if err != nil {
		return err
	}
	return c.write(ctx, frame)
}

func (c *Conn) encodeRequest(ctx context.Context, id ID, method string, params any) ([]byte, error) {
	raw, err := encodeParams(params)
	if err != nil {
		return nil, fmt.Errorf("jsonrpc: params of %s: %w", method, err)
	}
	if c.opts.trace && raw != nil {
		raw = injectTrace(ctx, raw)
	}
	return appendRequest(make([]byte, 0, 64+len(method)+len(raw)), &Request{ID: id, Method: method, Params: raw}), nil
}

func encodeParams(params any) (json.RawMessage, error) {
	var raw []byte
	switch p := params.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(p) == 0 {
			return nil, nil
		}
		if !json.Valid(p) {
			return nil, errors.New("not valid JSON")
		}
		raw = p
	default:
		var err error
		if raw, err = json.Marshal(p); err != nil {
			return nil, err
		}
	}
	switch raw[jsonscan.SkipSpace(raw, 0)] {
	case '{', '[':
		return raw, nil
	case 'n':
		return nil, nil
	}
	return nil, errors.New("must be a JSON object or array")
}

// write sends a frame. A failure other than ctx ending before the frame was
// started breaks the stream, and ends the connection.
func (c *Conn) write(ctx context.Context, frame []byte) error {
	return c.writeWith(ctx, frame, nil)
}

// writeWith is write, except that the frame is only queued on qs when qs
// is not nil; qs then keeps it.
func (c *Conn) writeWith(ctx context.Context, frame []byte, qs QueueingStream) error {
	select {
	case <-c.done:
		return c.err
	default:
	}
	var err error
	if qs != nil {
		err = qs.QueueMessage(ctx, frame)
	} else {
		err = c.stream.WriteMessage(ctx, frame)
	}
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return err
	}
	c.shutdown(fmt.Errorf("writing: %w", err))
	return c.err
}

// Close ends the connection: pending calls fail, handlers' contexts are
// cancelled, and the stream is closed. It returns the stream's Close error.
func (c *Conn) Close() error {
	c.shutdown(nil)
	return c.closeErr
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns nil while the connection is open, and then why it ended, as an
// error wrapping ErrClosed.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

func (c *Conn) shutdown(cause error) {
	c.closeOnce.Do(func() {
		c.err = ErrClosed
		if cause != nil {
			c.err = fmt.Errorf("%w: %w", ErrClosed, cause)
		}
		c.cancel()
		c.closeErr = c.stream.Close()
		close(c.done)
		// Calls made with Go hear of the end here; Wait watches done.
		c.mu.Lock()
		c.closed = true
		var ended []func(json.RawMessage, error)
		for id, p := range c.pending {
			if p.done != nil {
				ended = append(ended, p.done)
				delete(c.pending, id)
			}
		}
		c.mu.Unlock()
		for _, done := range ended {
			c.callDone(done, callResult{err: c.err})
		}
	})
}

func (c *Conn) readLoop() {
	for {
		// Not c.ctx: Close ends the read by closing the stream, which for a
		// WebSocket sends a close frame; a cancelled read would instead drop
		// the connection without one.
		data, err := c.stream.ReadMessage(context.Background())
		if err != nil {
			c.shutdown(fmt.Errorf("reading: %w", err))
			return
		}
		c.handleFrame(data)
	}
}

// acquire waits for a handler slot, reporting false if the connection
// ended first. Only the read loop acquires, so waiting is what stops it
// reading.
func (c *Conn) acquire() bool {
	select {
	case c.slots <- struct{}{}:
		return true
	case <-c.done:
		return false
	}
}

func (c *Conn) release() { <-c.slots }

// unsentPerSlot sets the bound on unsent replies; see WithMaxInflight.
const unsentPerSlot = 16

// sendReply writes a reply to the peer.
func (c *Conn) sendReply(frame []byte) {
	defer c.unsent.Add(-1)
	if n := c.unsent.Add(1); n > int64(unsentPerSlot*cap(c.slots)) {
		c.shutdown(fmt.Errorf("the peer is not reading: %d replies unsent", n-1))
		return
	}
	if err := c.write(c.ctx, frame); err != nil {
		c.opts.logger.Debug("jsonrpc: sending a reply", "error", err)
	}
}

func (c *Conn) sendResponse(r *Response) {
	size := 64 + len(r.Result) // the envelope and a typical id fit in 64 bytes
	if r.Error != nil {
		size += len(r.Error.Message) + len(r.Error.Data)
	}
	c.sendReply(appendResponse(make([]byte, 0, size), r))
}

func (c *Conn) handleFrame(data []byte) {
	msg, derr := decodeFrame(data)
	if derr != nil {
		if out := c.handleInvalid(derr); out != nil {
			// Not written here: the read loop never waits for the peer to
			// read, or two peers writing to each other could deadlock.
			go c.sendResponse(out)
		}
		return
	}
	switch m := msg.(type) {
	case *Request:
		if m.IsNotification() {
			c.handleNotification(m)
			return
		}
		if c.acquire() {
			c.startCall(m, c.sendResponse)
		}
	case *Response:
		c.deliver(m.ID, callResult{result: m.Result, err: errorOrNil(m.Error)})
	case *Batch:
		c.handleBatch(m)
	}
}

func errorOrNil(e *Error) error {
	if e == nil {
		return nil
	}
	return e
}

// handleInvalid returns the error response for a message that did not
// decode, or nil if it must not be answered.
func (c *Conn) handleInvalid(d *DecodeError) *Response {
	if !d.IsResponse {
		return &Response{ID: d.ID, Error: d.Err}
	}
	// A broken answer to one of our calls fails that call instead of leaving
	// it to wait for an answer that already came.
	c.deliver(d.ID, callResult{err: fmt.Errorf("jsonrpc: invalid response from peer: %w", d)})
	return nil
}

// deliver hands a response to the call waiting for it.
func (c *Conn) deliver(id ID, r callResult) {
	n, ok := id.int64()
	var p pendingCall
	if ok {
		c.mu.Lock()
		p, ok = c.pending[n]
		delete(c.pending, n)
		c.mu.Unlock()
	}
	switch {
	case !ok:
		// Usually the answer to a call its caller stopped waiting for.
		c.opts.logger.Debug("jsonrpc: response to no pending call", "id", id.String(), "error", r.err)
	case p.done != nil:
		c.callDone(p.done, r)
	default:
		p.ch <- r
	}
}

// callDone runs a Go call's done. A panic in it is logged rather than
// taking down the read loop, and with it the process.
func (c *Conn) callDone(done func(json.RawMessage, error), r callResult) {
	defer func() {
		if p := recover(); p != nil {
			c.opts.logger.Error("jsonrpc: response callback panicked", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	done(r.result, r.err)
}

func (c *Conn) handleNotification(req *Request) {
	if c.opts.cancelMethod != "" && req.Method == c.opts.cancelMethod {
		c.cancelInbound(req)
		return
	}
	ctx := c.ctx
	if c.opts.trace && req.Params != nil {
		ctx = extractTrace(ctx, req.Params)
	}
	c.invoke(ctx, req)
}

func (c *Conn) cancelInbound(req *Request) {
	var it iter
	if len(req.Params) == 0 || req.Params[0] != '{' {
		return
	}
	it.init(req.Params)
	for it.nextMember() {
		if string(it.key) != c.opts.cancelIDField {
			continue
		}
		id, ok := parseID(it.val)
		if !ok {
			return
		}
		c.mu.Lock()
		cancel := c.inflight.get(id)
		c.mu.Unlock()
		if cancel != nil {
			cancel(errCancelledByPeer)
		}
		return
	}
}

// startCall handles one of the peer's calls, on its own goroutine unless
// an AsyncHandler takes it, holding a slot the caller acquired until the
// call is answered, and then passes the response to send.
func (c *Conn) startCall(req *Request, send func(*Response)) {
	ctx := c.ctx
	if c.opts.trace && req.Params != nil {
		ctx = extractTrace(ctx, req.Params)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	// A null id cannot be cancelled, so it is not tracked, and may repeat.
	tracked, dup := !req.ID.IsNull(), false
	if tracked {
		c.mu.Lock()
		dup = !c.inflight.add(req.ID, cancel)
		c.mu.Unlock()
	}
	if !dup {
		if ah, ok := c.handler.(AsyncHandler); ok && c.handleAsync(ah, ctx, cancel, tracked, req, send) {
			return
		}
	}
	go func() {
		var resp *Response
		if dup {
			// A cancellation could not say which of the two it meant.
			resp = &Response{ID: req.ID, Error: &Error{Code: InvalidRequest, Message: "Invalid Request: id " + req.ID.String() + " is already in use"}}
		} else {
			resp = c.invoke(ctx, req)
			if tracked {
				c.mu.Lock()
				c.inflight.remove(req.ID)
				c.mu.Unlock()
			}
		}
		cancel(nil)
		c.release()
		send(resp)
	}()
}

// handleAsync offers a call to an AsyncHandler, reporting whether it took
// it. A panic becomes an InternalError answer, as in invoke.
func (c *Conn) handleAsync(h AsyncHandler, ctx context.Context, cancel context.CancelCauseFunc, tracked bool, req *Request, send func(*Response)) (taken bool) {
	var replied atomic.Bool
	reply := func(result any, err error) {
		if replied.Swap(true) {
			c.opts.logger.Error("jsonrpc: a call was answered twice", "method", req.Method, "id", req.ID.String())
			return
		}
		resp := c.response(ctx, req.ID, result, err)
		if tracked {
			c.mu.Lock()
			c.inflight.remove(req.ID)
			c.mu.Unlock()
		}
		cancel(nil)
		c.release()
		send(resp)
	}
	defer func() {
		if p := recover(); p != nil {
			c.opts.logger.Error("jsonrpc: handler panicked", "method", req.Method, "panic", p, "stack", string(debug.Stack()))
			taken = true
			if !replied.Load() {
				reply(nil, &Error{Code: InternalError, Message: "Internal error"})
			}
		}
	}()
	return h.HandleAsync(ctx, req, reply)
}

// invoke calls the handler and returns the response to send, or nil for a
// notification. A panic, in the handler or in encoding its result, becomes
// an InternalError response so that one bad request takes down neither the
// process nor the connection.
func (c *Conn) invoke(ctx context.Context, req *Request) (resp *Response) {
	defer func() {
		if p := recover(); p != nil {
			c.opts.logger.Error("jsonrpc: handler panicked", "method", req.Method, "panic", p, "stack", string(debug.Stack()))
			if !req.IsNotification() {
				// The panic value stays in our logs: it may hold internals
				// the peer has no business seeing.
				resp = &Response{ID: req.ID, Error: &Error{Code: InternalError, Message: "Internal error"}}
			}
		}
	}()
	var (
		result any
		err    error
	)
	if c.handler == nil {
		err = &Error{Code: MethodNotFound, Message: "Method not found: " + req.Method}
	} else {
		result, err = c.handler.Handle(ctx, req)
	}
	if req.IsNotification() {
		if err != nil {
			c.opts.logger.Debug("jsonrpc: notification handler failed", "method", req.Method, "error", err)
		}
		return nil
	}
	return c.response(ctx, req.ID, result, err)
}

// response builds the response to a call from what its handler returned.
func (c *Conn) response(ctx context.Context, id ID, result any, err error) *Response {
	if err == nil {
		raw, merr := encodeResult(result)
		if merr == nil {
			return &Response{ID: id, Result: raw}
		}
		err = fmt.Errorf("encoding the result: %w", merr)
	}
	var e *Error
	switch {
	case errors.As(err, &e) && e != nil:
		if len(e.Data) > 0 && !json.Valid(e.Data) {
			e = &Error{Code: e.Code, Message: e.Message} // invalid data would corrupt the frame
		}
	case errors.Is(context.Cause(ctx), errCancelledByPeer):
		e = &Error{Code: RequestCancelled, Message: "Request cancelled"}
	default:
		e = &Error{Code: InternalError, Message: err.Error()}
	}
	return &Response{ID: id, Error: e}
}

func encodeResult(result any) (json.RawMessage, error) {
	if raw, ok := result.(json.RawMessage); ok {
		if raw == nil {
			return nil, nil // encodes as null
		}
		if !json.Valid(raw) {
			return nil, errors.New("not valid JSON")
		}
		return raw, nil
	}
	return json.Marshal(result)
}

// handleBatch handles a batch as the spec asks: every call's response goes
// back in one array, sent once all are ready; a batch needing none gets no
// reply at all.
func (c *Conn) handleBatch(b *Batch) {
	var (
		mu        sync.Mutex
		responses []*Response
		wg        sync.WaitGroup
	)
	add := func(r *Response) {
		mu.Lock()
		responses = append(responses, r)
		mu.Unlock()
	}
	for _, d := range b.Invalid {
		if r := c.handleInvalid(d); r != nil {
			add(r)
		}
	}
	for _, msg := range b.Messages {
		switch m := msg.(type) {
		case *Request:
			if m.IsNotification() {
				c.handleNotification(m)
				continue
			}
			if !c.acquire() {
				return
			}
			wg.Add(1)
			c.startCall(m, func(r *Response) { add(r); wg.Done() })
		case *Response:
			c.deliver(m.ID, callResult{result: m.Result, err: errorOrNil(m.Error)})
		}
	}
	go func() {
		wg.Wait()
		if len(responses) == 0 {
			return
		}
		frame := []byte{'['}
		for i, r := range responses {
			if i > 0 {
				frame = append(frame, ',')
			}
			frame = appendResponse(frame, r)
		}
		c.sendReply(append(frame, ']'))
	}()
}

// inflightCalls maps the ids of the peer's calls being handled to their
// cancel functions. Its methods are called with Conn.mu held.
type inflightCalls struct {
	oneID     ID
	oneCancel context.CancelCauseFunc // nil when the slot is free
	more      map[ID]context.CancelCauseFunc
}

func (f *inflightCalls) get(id ID) context.CancelCauseFunc {
	if f.oneCancel != nil && f.oneID == id {
		return f.oneCancel
	}
	return f.more[id]
}

// add records a call, reporting false if its id is already in use.
func (f *inflightCalls) add(id ID, cancel context.CancelCauseFunc) bool {
	if f.get(id) != nil {
		return false
	}
	if f.oneCancel == nil {
		f.oneID, f.oneCancel = id, cancel
		return true
	}
	if f.more == nil {
		f.more = make(map[ID]context.CancelCauseFunc)
	}
	f.more[id] = cancel
	return true
}

func (f *inflightCalls) remove(id ID) {
	if f.oneCancel != nil && f.oneID == id {
		f.oneID, f.oneCancel = ID{}, nil
		return
	}
	delete(f.more, id)
	if len(f.more) == 0 {
		f.more = nil
	}
}
