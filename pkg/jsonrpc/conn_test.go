package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

type echoParams struct {
	N    int    `json:"n"`
	Text string `json:"text"`
}

func TestConcurrentCalls(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		client, _ := connPair(t, tr, nil, echo)
		const calls = 200
		var wg sync.WaitGroup
		errs := make(chan error, calls)
		for i := range calls {
			wg.Go(func() {
				want := echoParams{N: i, Text: strings.Repeat("x", i)}
				var got echoParams
				if err := client.Call(t.Context(), "echo", want, &got); err != nil {
					errs <- fmt.Errorf("call %d: %w", i, err)
					return
				}
				if got != want {
					errs <- fmt.Errorf("call %d: got %+v, want %+v", i, got, want)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// TestStartThenWait sends many calls before waiting for any, then waits
// for them in reverse order: each gets its own answer, and a Wait whose
// context ends cancels its call at the peer.
func TestStartThenWait(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		blk := newBlocker()
		client, _ := connPair(t, tr, nil, Methods{"echo": echo.Handle, "block": blk.Handle})
		const calls = 50
		pending := make([]*PendingCall, calls)
		for i := range calls {
			p, err := client.Start(t.Context(), "echo", echoParams{N: i, Text: strings.Repeat("y", i)})
			if err != nil {
				t.Fatalf("start %d: %v", i, err)
			}
			pending[i] = p
		}
		for i := calls - 1; i >= 0; i-- {
			var got echoParams
			if err := pending[i].Wait(t.Context(), &got); err != nil {
				t.Fatalf("wait %d: %v", i, err)
			}
			if want := (echoParams{N: i, Text: strings.Repeat("y", i)}); got != want {
				t.Errorf("call %d: got %+v, want %+v", i, got, want)
			}
		}
		p, err := client.Start(t.Context(), "block", nil)
		if err != nil {
			t.Fatal(err)
		}
		<-blk.started
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := p.Wait(ctx, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
		if cause := <-blk.ended; !errors.Is(cause, errCancelledByPeer) {
			t.Errorf("handler's context ended with %v, want the peer's cancellation", cause)
		}
	})
}

// queueingStream is a QueueingStream over a stream that writes only: it
// holds queued frames until Flush.
type queueingStream struct {
	Stream
	mu      sync.Mutex
	queued  [][]byte
	flushes int
}

func (s *queueingStream) QueueMessage(_ context.Context, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queued = append(s.queued, data)
	return nil
}

func (s *queueingStream) Flush() error {
	s.mu.Lock()
	frames := s.queued
	s.queued = nil
	s.flushes++
	s.mu.Unlock()
	for _, f := range frames {
		if err := s.WriteMessage(context.Background(), f); err != nil {
			return err
		}
	}
	return nil
}

func (s *queueingStream) waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queued)
}

// TestGoDeferred: on a QueueingStream, GoDeferred only queues the
// request, which Flush sends; on any other stream it sends at once. Each
// answer goes to its callback.
func TestGoDeferred(t *testing.T) {
	t.Parallel()
	for _, queueing := range []bool{true, false} {
		t.Run(fmt.Sprintf("queueing=%v", queueing), func(t *testing.T) {
			t.Parallel()
			sa, sb := linePair(t, 0, 0)
			qs := &queueingStream{Stream: sa}
			var clientStream Stream = sa
			if queueing {
				clientStream = qs
			}
			client := NewConn(clientStream, nil, quiet)
			server := NewConn(sb, Methods{"echo": echo.Handle}, quiet)
			t.Cleanup(func() { client.Close(); server.Close() })

			answers := make([]chan echoParams, 3)
			for i := range answers {
				answers[i] = make(chan echoParams, 1)
				_, err := client.GoDeferred(t.Context(), "echo", echoParams{N: i}, func(result json.RawMessage, err error) {
					var got echoParams
					if err == nil {
						err = json.Unmarshal(result, &got)
					}
					if err != nil {
						t.Errorf("call %d: %v", i, err)
					}
					answers[i] <- got
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if queueing && qs.waiting() != 3 {
				t.Fatalf("%d requests queued before Flush, want 3", qs.waiting())
			}
			if err := client.Flush(); err != nil {
				t.Fatal(err)
			}
			if queueing && (qs.waiting() != 0 || qs.flushes != 1) {
				t.Fatalf("after Flush: %d queued, %d flushes", qs.waiting(), qs.flushes)
			}
			for i, ch := range answers {
				if got := <-ch; got.N != i {
					t.Errorf("call %d: answered %+v", i, got)
				}
			}
		})
	}
}

// TestBidirectional has both ends call each other at once, and calls that
// call back into their caller before answering, as an ACP agent asks for
// permission while our session/prompt is in flight.
func TestBidirectional(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		handler := func(side string) Handler {
			return Methods{
				"whoami": func(context.Context, *Request) (any, error) { return side, nil },
				// prompt asks its caller for permission before answering.
				"prompt": func(ctx context.Context, req *Request) (any, error) {
					conn, ok := ConnFromContext(ctx)
					if !ok {
						return nil, errors.New("no connection in context")
					}
					var granted bool
					if err := conn.Call(ctx, "permission", req.Params, &granted); err != nil {
						return nil, err
					}
					return map[string]bool{"granted": granted}, nil
				},
				"permission": func(ctx context.Context, req *Request) (any, error) {
					var p echoParams
					if err := req.DecodeParams(&p); err != nil {
						return nil, err
					}
					return p.N%2 == 0, nil
				},
			}
		}
		// Each end has at most rounds prompt handlers waiting on the
		// other at once; rounds must stay under the in-flight limit, or
		// they would hold every slot and stop the connections reading
		// the answers they wait for (see WithMaxInflight).
		a, b := connPair(t, tr, handler("a"), handler("b"))

		const rounds = 50
		var wg sync.WaitGroup
		errs := make(chan error, 4*rounds)
		for i := range rounds {
			for _, pair := range []struct {
				from      *Conn
				peer      string
				fromLabel string
			}{{a, "b", "a"}, {b, "a", "b"}} {
				wg.Go(func() {
					var who string
					if err := pair.from.Call(t.Context(), "whoami", nil, &who); err != nil || who != pair.peer {
						errs <- fmt.Errorf("%s: whoami = %q, %v; want %q", pair.fromLabel, who, err, pair.peer)
					}
				})
				wg.Go(func() {
					var got map[string]bool
					err := pair.from.Call(t.Context(), "prompt", echoParams{N: i}, &got)
					if err != nil || got["granted"] != (i%2 == 0) {
						errs <- fmt.Errorf("%s: prompt %d = %v, %v", pair.fromLabel, i, got, err)
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

func TestCallArguments(t *testing.T) {
	t.Parallel()
	client, _ := connPair(t, transports[0], nil, echo)
	tests := []struct {
		name    string
		params  any
		result  any
		wantErr string
	}{
		{name: "scalar params", params: 5, wantErr: "must be a JSON object or array"},
		{name: "invalid raw params", params: json.RawMessage(`{"a":`), wantErr: "not valid JSON"},
		{name: "unencodable params", params: func() {}, wantErr: "unsupported type"},
		{name: "result of the wrong type", params: []int{1}, result: new(string), wantErr: "decoding the result of echo"},
		{name: "raw params with newlines", params: json.RawMessage("[1,\n2]"), result: new([]int)},
		{name: "null params", params: json.RawMessage(`null`)},
		{name: "empty raw params", params: json.RawMessage(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := client.Call(t.Context(), "echo", tt.params, tt.result)
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("Call: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Call = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// blocker is a handler that blocks until its context ends or it is
// released, and reports which.
type blocker struct {
	startOnce sync.Once
	started   chan struct{} // closed when the first call starts
	release   chan struct{}
	ended     chan error // per call: context.Cause of its ctx, or nil if released
}

func newBlocker() *blocker {
	return &blocker{started: make(chan struct{}), release: make(chan struct{}), ended: make(chan error, 64)}
}

func (b *blocker) Handle(ctx context.Context, _ *Request) (any, error) {
	b.startOnce.Do(func() { close(b.started) })
	select {
	case <-ctx.Done():
		b.ended <- context.Cause(ctx)
		return nil, ctx.Err()
	case <-b.release:
		b.ended <- nil
		return "released", nil
	}
}

// callOutcome is what a Go call's done received.
type callOutcome struct {
	result json.RawMessage
	err    error
}

func goCall(t *testing.T, c *Conn, method string, params any) (*PendingCall, <-chan callOutcome) {
	t.Helper()
	out := make(chan callOutcome, 2) // room for a second call, which would be a bug the test reports
	p, err := c.Go(t.Context(), method, params, func(result json.RawMessage, err error) { out <- callOutcome{result, err} })
	if err != nil {
		t.Fatalf("Go %s: %v", method, err)
	}
	return p, out
}

// once returns the one outcome a done received, failing if there was
// another.
func once(t *testing.T, out <-chan callOutcome) callOutcome {
	t.Helper()
	o := <-out
	select {
	case again := <-out:
		t.Errorf("done called twice: %+v, then %+v", o, again)
	default:
	}
	return o
}

// TestGo: a call made with Go has its answer, or its end, delivered to its
// callback once: the response, the abandonment (which cancels the peer's
// handler), or the end of the connection.
func TestGo(t *testing.T) {
	eachTransport(t, func(t *testing.T, tr transport) {
		blk := newBlocker()
		client, _ := connPair(t, tr, nil, Methods{"echo": echo.Handle, "block": blk.Handle})

		_, out := goCall(t, client, "echo", echoParams{N: 7})
		if o := once(t, out); o.err != nil || string(o.result) != `{"n":7,"text":""}` {
			t.Errorf("echo: %s, %v", o.result, o.err)
		}

		p, out := goCall(t, client, "block", nil)
		<-blk.started
		abandoned := errors.New("gave up")
		p.Abandon(abandoned)
		if o := once(t, out); !errors.Is(o.err, abandoned) {
			t.Errorf("abandoned call: %v, want %v", o.err, abandoned)
		}
		if cause := <-blk.ended; !errors.Is(cause, errCancelledByPeer) {
			t.Errorf("handler's context ended with %v, want the peer's cancellation", cause)
		}
		p.Abandon(abandoned) // a second time: nothing more

		_, out = goCall(t, client, "block", nil)
		client.Close()
		if o := once(t, out); !errors.Is(o.err, ErrClosed) {
			t.Errorf("call pending at Close: %v, want ErrClosed", o.err)
		}
		if _, err := client.Go(t.Context(), "echo", nil, func(json.RawMessage, error) { t.Error("done of a call that was not made") }); !errors.Is(err, ErrClosed) {
			t.Errorf("Go after Close = %v, want ErrClosed", err)
		}
	})
}

func TestEncodeParams(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		params    any
		wantFrame string // the request as sent, with id 1
		wantErr   string
	}{
		{name: "object", params: map[string]int{"a": 1}, wantFrame: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1}}`},
		{name: "raw array", params: json.RawMessage(`[1,2]`), wantFrame: `{"jsonrpc":"2.0","id":1,"method":"m","params":[1,2]}`},
		{name: "null", params: json.RawMessage(`null`), wantFrame: `{"jsonrpc":"2.0","id":1,"method":"m"}`},
		{name: "invalid raw", params: json.RawMessage(`{"a":`), wantErr: "not valid JSON"},
		{name: "scalar", params: 5, wantErr: "must be a JSON object or array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := EncodeParams(tt.params)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("EncodeParams = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("EncodeParams: %v", err)
			}
			c, peer := rawPair(t, nil)
			// The same encoded params serve several requests.
			for i := range 2 {
				sent := goSend(t, c, p)
				want := strings.Replace(tt.wantFrame, `"id":1`, fmt.Sprintf(`"id":%d`, i+1), 1)
				if got := peer.recv(); got != want {
					t.Errorf("request %d = %s, want %s", i+1, got, want)
				}
				if err := <-sent; err != nil {
					t.Fatalf("Go: %v", err)
				}
			}
		})
	}
	t.Run("nil", func(t *testing.T) {
		t.Parallel()
		c, peer := rawPair(t, nil)
		sent := goSend(t, c, (*Params)(nil))
		if got, want := peer.recv(), `{"jsonrpc":"2.0","id":1,"method":"m"}`; got != want {
			t.Errorf("request = %s, want %s", got, want)
		}
		if err := <-sent; err != nil {
			t.Fatalf("Go: %v", err)
		}
	})
}

// goSend sends method m with params on its own goroutine, as the raw
// peer's pipe takes a write only while it reads, and returns Go's error.
func goSend(t *testing.T, c *Conn, params *Params) <-chan error {
	sent := make(chan error, 1)
	go func() {
		_, err := c.Go(t.Context(), "m", params, func(json.RawMessage, error) {})
		sent <- err
	}()
	return sent
}
