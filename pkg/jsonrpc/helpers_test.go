package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// transport makes a connected pair of streams with the given frame limits.
type transport struct {
	name string
	pair func(tb testing.TB, maxA, maxB int) (Stream, Stream)
}

var transports = []transport{
	{"line", linePair},
	{"websocket", wsPair},
}

func linePair(tb testing.TB, maxA, maxB int) (Stream, Stream) {
	c1, c2 := net.Pipe()
	tb.Cleanup(func() { c1.Close(); c2.Close() })
	return NewLineStream(c1, c1, maxA), NewLineStream(c2, c2, maxB)
}

func wsPair(tb testing.TB, maxA, maxB int) (Stream, Stream) {
	accepted := make(chan *websocket.Conn, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			tb.Errorf("accept: %v", err)
			return
		}
		accepted <- c
		<-release
	}))
	tb.Cleanup(func() { close(release); srv.Close() })
	client, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	server := <-accepted
	tb.Cleanup(func() { client.CloseNow(); server.CloseNow() })
	return NewWebSocketStream(client, maxA), NewWebSocketStream(server, maxB)
}

var quiet = WithLogger(slog.New(slog.DiscardHandler))

// connPair starts a connection on each end of a transport's streams.
func connPair(tb testing.TB, tr transport, ha, hb Handler, opts ...Option) (*Conn, *Conn) {
	sa, sb := tr.pair(tb, 0, 0)
	opts = append([]Option{quiet}, opts...)
	a, b := NewConn(sa, ha, opts...), NewConn(sb, hb, opts...)
	tb.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// rawPeer is the far end of a line stream driven by hand, for sending frames
// no Conn would send.
type rawPeer struct {
	tb   testing.TB
	conn net.Conn
	r    *bufio.Reader
}

// rawPair starts a Conn with handler h and returns the raw peer facing it.
func rawPair(tb testing.TB, h Handler, opts ...Option) (*Conn, *rawPeer) {
	c1, c2 := net.Pipe()
	tb.Cleanup(func() { c1.Close(); c2.Close() })
	c := NewConn(NewLineStream(c1, c1, 0), h, append([]Option{quiet}, opts...)...)
	tb.Cleanup(func() { c.Close() })
	return c, &rawPeer{tb: tb, conn: c2, r: bufio.NewReader(c2)}
}

func (p *rawPeer) send(frame string) {
	p.tb.Helper()
	if _, err := p.conn.Write([]byte(frame + "\n")); err != nil {
		p.tb.Fatalf("writing %s: %v", frame, err)
	}
}

// recv reads the next frame, as it was written.
func (p *rawPeer) recv() string {
	p.tb.Helper()
	line, err := p.r.ReadString('\n')
	if err != nil {
		p.tb.Fatalf("reading: %v", err)
	}
	return strings.TrimSuffix(line, "\n")
}

// wireResponse is a response as a test inspects it.
type wireResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *Error          `json:"error"`
}

func (p *rawPeer) recvResponse() wireResponse {
	p.tb.Helper()
	frame := p.recv()
	var r wireResponse
	if err := json.Unmarshal([]byte(frame), &r); err != nil {
		p.tb.Fatalf("response %s: %v", frame, err)
	}
	return r
}

func (p *rawPeer) recvBatch() []wireResponse {
	p.tb.Helper()
	frame := p.recv()
	var rs []wireResponse
	if err := json.Unmarshal([]byte(frame), &rs); err != nil {
		p.tb.Fatalf("batch response %s: %v", frame, err)
	}
	return rs
}

// echo answers with its params.
var echo = HandlerFunc(func(_ context.Context, req *Request) (any, error) {
	return req.Params, nil
})

// eachTransport runs test on every transport, each a parallel subtest
// named for it, in parallel with the other tests.
func eachTransport(t *testing.T, test func(t *testing.T, tr transport)) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			test(t, tr)
		})
	}
}
