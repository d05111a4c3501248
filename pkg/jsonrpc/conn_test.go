package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

type echoParams struct {
	N    int    `json:"n"`
	Text string `json:"text"`
}

func TestConcurrentCalls(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
}

// TestStartThenWait sends many calls before waiting for any, then waits
// for them in reverse order: each gets its own answer, and a Wait whose
// context ends cancels its call at the peer.
func TestStartThenWait(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
}

// recorder is a notification handler that keeps what it receives.
type recorder struct {
	mu  sync.Mutex
	got []int
}

func (r *recorder) Handle(_ context.Context, req *Request) (any, error) {
	var p echoParams
	if err := req.DecodeParams(&p); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.got = append(r.got, p.N)
	r.mu.Unlock()
	return nil, nil
}

func (r *recorder) snapshot() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func TestNotifications(t *testing.T) {
	t.Parallel()
	const n = 300
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	for _, tr := range transports {
		t.Run(tr.name+"/before a call", func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			client, _ := connPair(t, tr, nil, Methods{
				"update": rec.Handle,
				"sync":   func(context.Context, *Request) (any, error) { return nil, nil },
			})
			for i := range n {
				if err := client.Notify(t.Context(), "update", echoParams{N: i}); err != nil {
					t.Fatalf("Notify: %v", err)
				}
			}
			// The server handles notifications in order, on its read loop, so
			// by the time it reads the call they have all been handled.
			if err := client.Call(t.Context(), "sync", nil, nil); err != nil {
				t.Fatalf("Call: %v", err)
			}
			if got := rec.snapshot(); !slices.Equal(got, want) {
				t.Errorf("notifications handled as %v, want in order 0..%d", got, n-1)
			}
		})
		t.Run(tr.name+"/before a response", func(t *testing.T) {
			t.Parallel()
			// As an ACP agent streams session/update chunks and then answers
			// session/prompt: when Call returns, every chunk is in.
			rec := &recorder{}
			client, _ := connPair(t, tr, Methods{"update": rec.Handle}, Methods{
				"prompt": func(ctx context.Context, _ *Request) (any, error) {
					conn, _ := ConnFromContext(ctx)
					for i := range n {
						if err := conn.Notify(ctx, "update", echoParams{N: i}); err != nil {
							return nil, err
						}
					}
					return "done", nil
				},
			})
			if err := client.Call(t.Context(), "prompt", nil, nil); err != nil {
				t.Fatalf("Call: %v", err)
			}
			if got := rec.snapshot(); !slices.Equal(got, want) {
				t.Errorf("notifications handled as %v, want in order 0..%d", got, n-1)
			}
		})
	}
}

func TestNotificationResultsAreNeverSent(t *testing.T) {
	t.Parallel()
	_, peer := rawPair(t, Methods{
		"fails":  func(context.Context, *Request) (any, error) { return nil, errors.New("boom") },
		"panics": func(context.Context, *Request) (any, error) { panic("boom") },
		"ok":     func(context.Context, *Request) (any, error) { return 1, nil },
	})
	peer.send(`{"jsonrpc":"2.0","method":"fails"}`)
	peer.send(`{"jsonrpc":"2.0","method":"panics"}`)
	peer.send(`{"jsonrpc":"2.0","method":"missing"}`)
	peer.send(`{"jsonrpc":"2.0","method":"ok","id":1}`)
	// Notifications are handled in order before the call, so had any of them
	// been answered, that answer would come first.
	if r := peer.recvResponse(); string(r.ID) != "1" || string(r.Result) != "1" {
		t.Errorf("first frame = %+v, want the answer to call 1", r)
	}
}

func TestBatch(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	h := Methods{
		"sum": func(_ context.Context, req *Request) (any, error) {
			var xs []int
			if err := req.DecodeParams(&xs); err != nil {
				return nil, err
			}
			total := 0
			for _, x := range xs {
				total += x
			}
			return total, nil
		},
		"subtract": func(_ context.Context, req *Request) (any, error) {
			var xs [2]int
			if err := req.DecodeParams(&xs); err != nil {
				return nil, err
			}
			return xs[0] - xs[1], nil
		},
		"notify": rec.Handle,
	}
	type want struct {
		result string
		code   int
	}
	tests := []struct {
		name  string
		frame string
		// want is keyed by the response's raw id; nil means a single error
		// object, not an array, is expected.
		want map[string]want
		// single is the one error expected instead of an array.
		single *want
	}{
		{
			name: "the spec's example",
			frame: `[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},` +
				`{"jsonrpc":"2.0","method":"notify","params":{"n":7}},` +
				`{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":"2"},` +
				`{"foo":"boo"},` +
				`{"jsonrpc":"2.0","method":"foo.get","params":{"name":"myself"},"id":"5"},` +
				`{"jsonrpc":"2.0","method":"get_data","id":"9"}]`,
			want: map[string]want{
				`"1"`:  {result: "7"},
				`"2"`:  {result: "19"},
				`null`: {code: InvalidRequest},
				`"5"`:  {code: MethodNotFound},
				`"9"`:  {code: MethodNotFound},
			},
		},
		{
			name:  "numbers ids stay numbers",
			frame: `[{"jsonrpc":"2.0","method":"sum","params":[1],"id":1},{"jsonrpc":"2.0","method":"sum","params":[2],"id":"1"}]`,
			want:  map[string]want{`1`: {result: "1"}, `"1"`: {result: "2"}},
		},
		{
			name:  "one invalid element",
			frame: `[1]`,
			want:  map[string]want{`null`: {code: InvalidRequest}},
		},
		{
			name:   "empty",
			frame:  `[]`,
			single: &want{code: InvalidRequest},
		},
		{
			name:   "invalid JSON",
			frame:  `[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method"]`,
			single: &want{code: ParseError},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, peer := rawPair(t, h)
			peer.send(tt.frame)
			if tt.single != nil {
				r := peer.recvResponse()
				if r.Error == nil || r.Error.Code != tt.single.code || string(r.ID) != "null" {
					t.Errorf("got %+v, want error %d with id null", r, tt.single.code)
				}
				return
			}
			got := peer.recvBatch()
			if len(got) != len(tt.want) {
				t.Fatalf("got %d responses, want %d: %+v", len(got), len(tt.want), got)
			}
			for _, r := range got {
				w, ok := tt.want[string(r.ID)]
				switch {
				case !ok:
					t.Errorf("unexpected response %+v", r)
				case w.code != 0 && (r.Error == nil || r.Error.Code != w.code):
					t.Errorf("id %s: got %+v, want error %d", r.ID, r, w.code)
				case w.code == 0 && string(r.Result) != w.result:
					t.Errorf("id %s: got %+v, want result %s", r.ID, r, w.result)
				}
			}
		})
	}

	t.Run("only notifications", func(t *testing.T) {
		t.Parallel()
		rec := &recorder{}
		_, peer := rawPair(t, Methods{
			"notify": rec.Handle,
			"sync":   func(context.Context, *Request) (any, error) { return "synced", nil },
		})
		peer.send(`[{"jsonrpc":"2.0","method":"notify","params":{"n":1}},{"jsonrpc":"2.0","method":"notify","params":{"n":2}}]`)
		peer.send(`{"jsonrpc":"2.0","method":"sync","id":1}`)
		if r := peer.recvResponse(); string(r.Result) != `"synced"` {
			t.Errorf("first frame = %+v, want the answer to sync: a batch of notifications gets no reply", r)
		}
		if got := rec.snapshot(); !slices.Equal(got, []int{1, 2}) {
			t.Errorf("notifications handled: %v, want [1 2]", got)
		}
	})
}

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

func TestDuplicateInflightID(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	_, peer := rawPair(t, Methods{"block": func(context.Context, *Request) (any, error) {
		close(started)
		<-release
		return "released", nil
	}})
	peer.send(`{"jsonrpc":"2.0","method":"block","id":1}`)
	<-started
	peer.send(`{"jsonrpc":"2.0","method":"block","id":1}`)
	if r := peer.recvResponse(); r.Error == nil || r.Error.Code != InvalidRequest {
		t.Errorf("duplicate id: got %+v, want InvalidRequest", r)
	}
	close(release)
	if r := peer.recvResponse(); string(r.Result) != `"released"` {
		t.Errorf("first call: got %+v", r)
	}
}

func TestMethodNotFound(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		for _, h := range []struct {
			name string
			h    Handler
		}{{"nil handler", nil}, {"Methods", Methods{"known": echo}}} {
			t.Run(tr.name+"/"+h.name, func(t *testing.T) {
				t.Parallel()
				client, _ := connPair(t, tr, nil, h.h)
				err := client.Call(t.Context(), "unknown", nil, nil)
				var e *Error
				if !errors.As(err, &e) || e.Code != MethodNotFound {
					t.Errorf("Call = %v, want MethodNotFound", err)
				}
			})
		}
	}
}

func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler HandlerFunc
		want    Error
	}{
		{
			name:    "plain error",
			handler: func(context.Context, *Request) (any, error) { return nil, errors.New("disk full") },
			want:    Error{Code: InternalError, Message: "disk full"},
		},
		{
			name: "wrapped *Error",
			handler: func(context.Context, *Request) (any, error) {
				return nil, fmt.Errorf("subscribing: %w", &Error{Code: -32001, Message: "Already initialized", Data: json.RawMessage(`{"since":1}`)})
			},
			want: Error{Code: -32001, Message: "Already initialized", Data: json.RawMessage(`{"since":1}`)},
		},
		{
			name:    "panic",
			handler: func(context.Context, *Request) (any, error) { panic("secret internals") },
			want:    Error{Code: InternalError, Message: "Internal error"},
		},
		{
			name:    "unencodable result",
			handler: func(context.Context, *Request) (any, error) { return make(chan int), nil },
			want:    Error{Code: InternalError, Message: "encoding the result: json: unsupported type: chan int"},
		},
		{
			name:    "invalid raw result",
			handler: func(context.Context, *Request) (any, error) { return json.RawMessage(`{`), nil },
			want:    Error{Code: InternalError, Message: "encoding the result: not valid JSON"},
		},
	}
	for _, tr := range transports {
		for _, tt := range tests {
			t.Run(tr.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				client, _ := connPair(t, tr, nil, Methods{"m": tt.handler, "ok": echo})
				err := client.Call(t.Context(), "m", nil, nil)
				var e *Error
				if !errors.As(err, &e) || e.Code != tt.want.Code || e.Message != tt.want.Message || string(e.Data) != string(tt.want.Data) {
					t.Errorf("Call = %#v, want %#v", err, tt.want)
				}
				// Neither the connection nor the process went down.
				if err := client.Call(t.Context(), "ok", []int{1}, nil); err != nil {
					t.Errorf("next call: %v", err)
				}
			})
		}
	}
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
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
}

func TestClose(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
}

func TestOversizedFrame(t *testing.T) {
	t.Parallel()
	const limit = 1024
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
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
}

// asyncHandler takes the methods in replies, answering each from its own
// goroutine once told to, and leaves the others to echo.
type asyncHandler struct {
	replies map[string]chan func(any, error)
}

func (h asyncHandler) Handle(ctx context.Context, req *Request) (any, error) {
	return echo.Handle(ctx, req)
}

func (h asyncHandler) HandleAsync(_ context.Context, req *Request, reply func(any, error)) bool {
	switch req.Method {
	case "now":
		reply("answered at once", nil)
		return true
	case "panic":
		panic("boom")
	}
	ch, ok := h.replies[req.Method]
	if ok {
		ch <- reply
	}
	return ok
}

// TestAsyncHandler: calls an AsyncHandler takes are answered when it
// replies, from any goroutine, once, each holding its in-flight slot until
// then; calls it declines go to Handle; a panic is an InternalError.
func TestAsyncHandler(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			later := make(chan func(any, error), 2)
			h := asyncHandler{replies: map[string]chan func(any, error){"later": later}}
			client, _ := connPair(t, tr, nil, h, WithMaxInflight(2))

			var got string
			if err := client.Call(t.Context(), "now", nil, &got); err != nil || got != "answered at once" {
				t.Errorf("now: %q, %v", got, err)
			}
			var echoed []int
			if err := client.Call(t.Context(), "declined", []int{1}, &echoed); err != nil || !slices.Equal(echoed, []int{1}) {
				t.Errorf("declined: %v, %v", echoed, err)
			}
			err := client.Call(t.Context(), "panic", nil, nil)
			var e *Error
			if !errors.As(err, &e) || e.Code != InternalError {
				t.Errorf("panic: %v, want InternalError", err)
			}

			// Two calls taken and not answered hold both slots: the
			// connection stops reading until one is answered.
			_, out1 := goCall(t, client, "later", nil)
			_, out2 := goCall(t, client, "later", nil)
			reply1, reply2 := <-later, <-later
			_, blocked := goCall(t, client, "now", nil)
			select {
			case o := <-blocked:
				t.Fatalf("a third call was handled with both slots held: %+v", o)
			default:
			}
			go reply1("one", nil)
			if o := once(t, out1); o.err != nil || string(o.result) != `"one"` {
				t.Errorf("first: %s, %v", o.result, o.err)
			}
			if o := once(t, blocked); o.err != nil {
				t.Errorf("third call, once a slot was free: %v", o.err)
			}
			reply2(nil, &Error{Code: 7, Message: "no"})
			reply2("again", nil) // ignored
			if o := once(t, out2); !errors.As(o.err, &e) || e.Code != 7 {
				t.Errorf("second: %v, want error 7", o.err)
			}
			if err := client.Call(t.Context(), "now", nil, nil); err != nil {
				t.Errorf("after a double reply: %v", err)
			}
		})
	}
}

// TestInline: an Inline handler answers each call from the read loop, in
// arrival order, errors and panics as Handle's would be.
func TestInline(t *testing.T) {
	t.Parallel()
	var seen []int
	h := Inline(Methods{
		"seq": func(_ context.Context, req *Request) (any, error) {
			var n []int
			if err := json.Unmarshal(req.Params, &n); err != nil {
				return nil, err
			}
			seen = append(seen, n[0]) // the read loop alone runs it: no lock
			return n[0], nil
		},
		"panic": func(context.Context, *Request) (any, error) { panic("boom") },
	})
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			client, _ := connPair(t, tr, nil, h)
			seen = nil
			var pending []*PendingCall
			for i := range 20 {
				p, err := client.Start(t.Context(), "seq", []int{i})
				if err != nil {
					t.Fatal(err)
				}
				pending = append(pending, p)
			}
			for i, p := range pending {
				var got int
				if err := p.Wait(t.Context(), &got); err != nil || got != i {
					t.Fatalf("call %d: %d, %v", i, got, err)
				}
			}
			for i, n := range seen {
				if n != i {
					t.Fatalf("handled in the order %v", seen)
				}
			}
			var e *Error
			if err := client.Call(t.Context(), "panic", nil, nil); !errors.As(err, &e) || e.Code != InternalError {
				t.Errorf("panic: %v, want InternalError", err)
			}
			if err := client.Call(t.Context(), "missing", nil, nil); !errors.As(err, &e) || e.Code != MethodNotFound {
				t.Errorf("unknown method: %v, want MethodNotFound", err)
			}
		})
	}
}
