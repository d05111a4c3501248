package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestMalformedFramesKeepTheConnection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		frame string
		code  int
		id    string
	}{
		{name: "parse error", frame: `{"jsonrpc":"2.0","method":"foobar,"params":"bar","baz]`, code: ParseError, id: "null"},
		{name: "not JSON at all", frame: `hello`, code: ParseError, id: "null"},
		{name: "not an object", frame: `42`, code: InvalidRequest, id: "null"},
		{name: "method is a number", frame: `{"jsonrpc":"2.0","method":1,"params":"bar","id":3}`, code: InvalidRequest, id: "3"},
		{name: "wrong version", frame: `{"jsonrpc":"1.0","method":"echo","id":"v"}`, code: InvalidRequest, id: `"v"`},
		{name: "bad id", frame: `{"jsonrpc":"2.0","method":"echo","id":[1]}`, code: InvalidRequest, id: "null"},
		{name: "unknown method", frame: `{"jsonrpc":"2.0","method":"nope","id":4}`, code: MethodNotFound, id: "4"},
		{name: "invalid params", frame: `{"jsonrpc":"2.0","method":"typed","params":{"n":"x"},"id":5}`, code: InvalidParams, id: "5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, peer := rawPair(t, Methods{
				"echo": echo,
				"typed": func(_ context.Context, req *Request) (any, error) {
					var p echoParams
					return p, req.DecodeParams(&p)
				},
			})
			peer.send(tt.frame)
			r := peer.recvResponse()
			if r.JSONRPC != "2.0" || r.Error == nil || r.Error.Code != tt.code || string(r.ID) != tt.id {
				t.Errorf("got %+v (error %+v), want error %d with id %s", r, r.Error, tt.code, tt.id)
			}
			// The connection carries on.
			peer.send(`{"jsonrpc":"2.0","method":"echo","params":[1],"id":"after"}`)
			if r := peer.recvResponse(); string(r.ID) != `"after"` || string(r.Result) != "[1]" {
				t.Errorf("after the bad frame: got %+v", r)
			}
		})
	}
}

func TestInvalidResponseFailsTheCall(t *testing.T) {
	t.Parallel()
	client, peer := rawPair(t, nil)
	errc := make(chan error, 1)
	go func() { errc <- client.Call(t.Context(), "m", nil, nil) }()
	req := peer.recv()
	var call struct{ ID json.RawMessage }
	if err := json.Unmarshal([]byte(req), &call); err != nil {
		t.Fatal(err)
	}
	peer.send(`{"jsonrpc":"2.0","id":` + string(call.ID) + `,"result":1,"error":{"code":1,"message":"x"}}`)
	err := <-errc
	var e *Error
	if !errors.As(err, &e) || e.Code != InvalidRequest || !strings.Contains(err.Error(), "invalid response") {
		t.Errorf("Call = %v, want an invalid response error", err)
	}
}

func TestCancellation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts []Option
		// reaches reports whether cancelling a call cancels the peer's handler.
		reaches bool
	}{
		{name: "LSP default", reaches: true},
		{name: "ACP", opts: []Option{WithCancelMethod("$/cancel_request", "requestId")}, reaches: true},
		{name: "off", opts: []Option{WithCancelMethod("", "")}, reaches: false},
	}
	for _, tr := range transports {
		for _, tt := range tests {
			for _, dir := range []string{"a calls b", "b calls a"} {
				t.Run(tr.name+"/"+tt.name+"/"+dir, func(t *testing.T) {
					t.Parallel()
					blk := newBlocker()
					a, b := connPair(t, tr, Methods{"block": blk.Handle}, Methods{"block": blk.Handle}, tt.opts...)
					caller := a
					if dir == "b calls a" {
						caller = b
					}
					ctx, cancel := context.WithCancel(t.Context())
					errc := make(chan error, 1)
					go func() { errc <- caller.Call(ctx, "block", nil, nil) }()
					<-blk.started
					cancel()
					if err := <-errc; !errors.Is(err, context.Canceled) {
						t.Fatalf("Call = %v, want context.Canceled", err)
					}
					if tt.reaches {
						if cause := <-blk.ended; !errors.Is(cause, errCancelledByPeer) {
							t.Errorf("handler's context ended with %v, want the peer's cancellation", cause)
						}
					} else {
						close(blk.release)
						if cause := <-blk.ended; cause != nil {
							t.Errorf("handler's context ended with %v, want it left running", cause)
						}
					}
					// The connection is still good.
					if err := caller.Call(t.Context(), "missing", nil, nil); !isCode(err, MethodNotFound) {
						t.Errorf("next call = %v, want MethodNotFound", err)
					}
				})
			}
		}
	}
}

func isCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

func TestCancelledRequestIsAnswered(t *testing.T) {
	t.Parallel()
	blk := newBlocker()
	_, peer := rawPair(t, Methods{"block": blk.Handle})
	peer.send(`{"jsonrpc":"2.0","method":"block","id":"p1"}`)
	<-blk.started
	peer.send(`{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"p1"}}`)
	r := peer.recvResponse()
	if string(r.ID) != `"p1"` || r.Error == nil || r.Error.Code != RequestCancelled {
		t.Errorf("got %+v, want RequestCancelled for p1", r)
	}
}

func TestMaxInflight(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		blk := newBlocker()
		client, _ := connPair(t, tr, nil, Methods{
			"block": blk.Handle,
			"quick": func(context.Context, *Request) (any, error) {
				select {
				case <-blk.release:
					return nil, nil
				default:
					return nil, errors.New("ran while the only slot was taken")
				}
			},
		}, WithMaxInflight(1))
		blocked := make(chan error, 1)
		go func() { blocked <- client.Call(t.Context(), "block", nil, nil) }()
		<-blk.started
		quick := make(chan error, 1)
		go func() { quick <- client.Call(t.Context(), "quick", nil, nil) }()
		close(blk.release)
		if err := <-blocked; err != nil {
			t.Errorf("blocking call: %v", err)
		}
		// It waited for the slot instead of failing.
		if err := <-quick; err != nil {
			t.Errorf("call over the limit: %v", err)
		}
	})
}

func TestPeerNotReading(t *testing.T) {
	t.Parallel()
	c, peer := rawPair(t, nil, WithMaxInflight(1))
	// Each frame earns an error reply; the peer reads none of them, and the
	// pipe has no buffer, so they pile up until the bound of 16 is passed.
	for range 100 {
		if _, err := peer.conn.Write([]byte("garbage\n")); err != nil {
			break // the connection gave up on us
		}
	}
	<-c.Done()
	if err := c.Err(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "not reading") {
		t.Errorf("Err = %v, want the peer reported as not reading", err)
	}
}

func TestPeerDisconnect(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		blk := newBlocker()
		client, server := connPair(t, tr, nil, Methods{"block": blk.Handle})
		const calls = 5
		errc := make(chan error, calls)
		for range calls {
			go func() { errc <- client.Call(t.Context(), "block", nil, nil) }()
		}
		<-blk.started // at least one is in the handler; the rest may be anywhere
		server.Close()
		for range calls {
			if err := <-errc; !errors.Is(err, ErrClosed) {
				t.Errorf("pending call = %v, want ErrClosed", err)
			}
		}
		<-client.Done()
		if err := client.Err(); !errors.Is(err, ErrClosed) {
			t.Errorf("Err = %v, want ErrClosed", err)
		}
		if err := client.Call(t.Context(), "block", nil, nil); !errors.Is(err, ErrClosed) {
			t.Errorf("call after close = %v, want ErrClosed", err)
		}
		if err := client.Notify(t.Context(), "x", nil); !errors.Is(err, ErrClosed) {
			t.Errorf("notify after close = %v, want ErrClosed", err)
		}
		// The server's handler saw its context end with the connection.
		if cause := <-blk.ended; cause == nil {
			t.Error("server handler was not cancelled by the close")
		}
	})
}

func TestClose(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		client, server := connPair(t, tr, nil, nil)
		if client.Err() != nil {
			t.Fatalf("Err before Close = %v", client.Err())
		}
		if err := client.Close(); err != nil {
			t.Errorf("Close = %v", err)
		}
		client.Close()
		<-client.Done()
		if err := client.Err(); err != ErrClosed {
			t.Errorf("Err after Close = %v, want exactly ErrClosed", err)
		}
		// The peer sees the end too.
		<-server.Done()
		if err := server.Err(); !errors.Is(err, ErrClosed) {
			t.Errorf("peer Err = %v, want ErrClosed", err)
		}
	})
}

func TestOversizedFrame(t *testing.T) {
	const limit = 1024
	eachTransport(t, func(t *testing.T, tr transport) {
		// Only the server has the small limit, so the client can send.
		sa, sb := tr.pair(t, 0, limit)
		client, server := NewConn(sa, nil, quiet), NewConn(sb, echo, quiet)
		t.Cleanup(func() { client.Close(); server.Close() })

		if err := client.Call(t.Context(), "echo", []string{strings.Repeat("x", limit/2)}, nil); err != nil {
			t.Fatalf("call under the limit: %v", err)
		}
		err := client.Call(t.Context(), "echo", []string{strings.Repeat("x", 2*limit)}, nil)
		if !errors.Is(err, ErrClosed) {
			t.Errorf("call over the limit = %v, want ErrClosed", err)
		}
		<-server.Done()
		if err := server.Err(); !errors.Is(err, ErrFrameTooLarge) {
			t.Errorf("server Err = %v, want ErrFrameTooLarge", err)
		}
	})
}
