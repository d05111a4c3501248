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

// Params are request params encoded and checked once (EncodeParams), for
// a request sent to many peers: a fan-out's requests then copy them
// instead of validating the same bytes once per peer.
type Params struct{ raw json.RawMessage }

// EncodeParams encodes params as Call and Go would, checking them once.
// Pass the result as the params of each request.
func EncodeParams(params any) (*Params, error) {
	raw, err := encodeParams(params)
	if err != nil {
		return nil, err
	}
	return &Params{raw: raw}, nil
}

func encodeParams(params any) (json.RawMessage, error) {
	var raw []byte
	switch p := params.(type) {
	case nil:
		return nil, nil
	case *Params:
		if p == nil {
			return nil, nil
		}
		return p.raw, nil
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
