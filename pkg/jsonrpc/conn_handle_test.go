package jsonrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

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
	eachTransport(t, func(t *testing.T, tr transport) {
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
