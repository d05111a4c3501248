package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// errCancelledByPeer is the cause of a handler's context when the peer
// cancelled the request, which the handler's error is then reported as.
var errCancelledByPeer = errors.New("jsonrpc: request cancelled by the peer")

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
