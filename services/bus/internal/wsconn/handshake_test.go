package wsconn

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/gobwas/ws"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

const validKey = "dGhlIHNhbXBsZSBub25jZQ=="

// TestHandshake: what is not a WebSocket version 13 upgrade from the
// bus's own origin is refused with an HTTP status and the bus's JSON error
// shape; a valid one is switched with the key's accept value (RFC 6455
// section 1.3's example).
func TestHandshake(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s, err := Accept(w, r, Options{MaxFrame: 1 << 20, Buffered: 10, WriteTimeout: time.Minute}); err == nil {
			_ = s.Close()
		} // else Accept answered the request
	}))
	t.Cleanup(srv.Close)
	httpURL := srv.URL
	tests := []struct {
		name   string
		method string
		header map[string]string // set over a valid upgrade's; "" deletes
		status int
		// answerHeader must be in the answer with this value.
		answerHeader [2]string
	}{
		{name: "valid", status: http.StatusSwitchingProtocols, answerHeader: [2]string{"Sec-WebSocket-Accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="}},
		{name: "same origin", header: map[string]string{"Origin": "{host}"}, status: http.StatusSwitchingProtocols},
		{name: "tokens in any case and among others", header: map[string]string{"Connection": "keep-alive, UPGRADE", "Upgrade": "WebSocket"}, status: http.StatusSwitchingProtocols},
		{name: "plain GET", header: map[string]string{"Connection": "", "Upgrade": ""}, status: http.StatusUpgradeRequired, answerHeader: [2]string{"Upgrade", "websocket"}},
		{name: "POST", method: http.MethodPost, status: http.StatusMethodNotAllowed, answerHeader: [2]string{"Allow", "GET"}},
		{name: "old version", header: map[string]string{"Sec-WebSocket-Version": "8"}, status: http.StatusUpgradeRequired, answerHeader: [2]string{"Sec-WebSocket-Version", "13"}},
		{name: "no version", header: map[string]string{"Sec-WebSocket-Version": ""}, status: http.StatusUpgradeRequired},
		{name: "no key", header: map[string]string{"Sec-WebSocket-Key": ""}, status: http.StatusBadRequest},
		{name: "key of the wrong size", header: map[string]string{"Sec-WebSocket-Key": "c2hvcnQ="}, status: http.StatusBadRequest},
		{name: "key not base64", header: map[string]string{"Sec-WebSocket-Key": "!!!!!!!!!!!!!!!!!!!!!!=="}, status: http.StatusBadRequest},
		{name: "foreign origin", header: map[string]string{"Origin": "https://evil.example"}, status: http.StatusForbidden},
		{name: "origin without a host", header: map[string]string{"Origin": "null"}, status: http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(tt.method, httpURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			h := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": validKey}
			for k, v := range tt.header {
				h[k] = strings.ReplaceAll(v, "{host}", httpURL)
			}
			for k, v := range h {
				if v != "" {
					req.Header.Set(k, v)
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			if k := tt.answerHeader[0]; k != "" && resp.Header.Get(k) != tt.answerHeader[1] {
				t.Errorf("%s: %q, want %q", k, resp.Header.Get(k), tt.answerHeader[1])
			}
			if tt.status == http.StatusSwitchingProtocols {
				return
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || !strings.HasPrefix(e.Error.Message, "bus: ") {
				t.Errorf("body not the bus's JSON error: %+v, %v", e, err)
			}
		})
	}
}

// rawClient is a client that sends hand-made frames and reads the
// server's, for what a WebSocket library would not send.
type rawClient struct {
	c  net.Conn
	br *bufio.Reader
}

// dialRaw opens a connection, sending first with the upgrade request (in
// the same write, as a client may).
func dialRaw(t *testing.T, url string, first []byte) *rawClient {
	t.Helper()
	host := strings.TrimPrefix(url, "ws://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	req := "GET / HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + validKey + "\r\n\r\n"
	if _, err := c.Write(append([]byte(req), first...)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return &rawClient{c: c, br: br}
}

// frame reads one server frame.
func (c *rawClient) frame(t *testing.T) (ws.OpCode, []byte) {
	t.Helper()
	h, err := ws.ReadHeader(c.br)
	if err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	if h.Masked || !h.Fin || h.Rsv != 0 {
		t.Fatalf("server frame header %+v", h)
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(c.br, p); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	return h.OpCode, p
}

// TestProtocol: the server's side of the exchanges of RFC 6455 section 5
// that clients rely on, against a raw client.
func TestProtocol(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		send  []byte
		reply []string // the server frames that answer, as "op:payload"
		read  string   // what ReadMessage returns first: a message, or the end
	}{
		{name: "sent with the upgrade request", send: stream(text(`{"early":1}`)), read: `{"early":1}`},
		{name: "ping", send: stream(clientFrame{fin: true, op: 0x9, payload: []byte("are you there")}, text("after")),
			reply: []string{"pong:are you there"}, read: "after"},
		{name: "pong unasked", send: stream(clientFrame{fin: true, op: 0xa, payload: []byte("x")}, text("after")), read: "after"},
		{name: "close", send: stream(clientFrame{fin: true, op: 0x8, payload: []byte("\x03\xe9bye")}),
			reply: []string{"close:\x03\xe9"}, read: "end: closed 1001"},
		{name: "close without a code", send: stream(clientFrame{fin: true, op: 0x8}),
			reply: []string{"close:"}, read: "end: closed 1005"},
		{name: "close with a code never sent", send: stream(clientFrame{fin: true, op: 0x8, payload: []byte("\x03\xee")}),
			reply: []string{"close:\x03\xea"}, read: "end: protocol error"},
		{name: "unmasked", send: stream(clientFrame{fin: true, op: 0x1, payload: []byte("x"), unmasked: true}),
			reply: []string{"close:\x03\xea"}, read: "end: protocol error"},
		{name: "too big", send: stream(text(strings.Repeat("x", 2000))),
			reply: []string{"close:\x03\xf1"}, read: "end: too large"},
		{name: "not utf-8", send: stream(text("\xc3")), reply: []string{"close:\x03\xef"}, read: "end: protocol error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			closed := make(chan struct{})
			url, streams := serveUnread(t, Options{MaxFrame: 1024, Buffered: 10, WriteTimeout: time.Minute, OnClose: func() { close(closed) }})
			client := dialRaw(t, url, tt.send)
			s := <-streams
			data, err := s.ReadMessage(context.Background())
			var got string
			var cerr *CloseError
			switch {
			case err == nil:
				got = string(data)
			case errors.As(err, &cerr):
				got = fmt.Sprintf("end: closed %d", cerr.Code)
			case errors.Is(err, jsonrpc.ErrFrameTooLarge):
				got = "end: too large"
			default:
				got = "end: protocol error"
			}
			if got != tt.read {
				t.Errorf("ReadMessage: %q (%v), want %q", got, err, tt.read)
			}
			for _, want := range tt.reply {
				op, p := client.frame(t)
				if reply := map[ws.OpCode]string{ws.OpPong: "pong", ws.OpClose: "close"}[op] + ":" + string(p); !strings.HasPrefix(reply, want) {
					t.Errorf("server sent %q, want %q", reply, want)
				}
			}
			if strings.HasPrefix(tt.read, "end") {
				<-closed
				// After the close frames, the server drops the connection.
				if _, err := client.br.ReadByte(); err != io.EOF {
					t.Errorf("after the close: %v, want the connection dropped", err)
				}
			}
		})
	}
}

// TestCloseHandshakeWithLibraryClient: a close started by the bus
// completes with a library client, whose read ends with the bus's code.
func TestCloseHandshakeWithLibraryClient(t *testing.T) {
	t.Parallel()
	url, streams := serve(t, Options{MaxFrame: 1 << 20, Buffered: 10, WriteTimeout: time.Minute})
	client := dial(t, url)
	s := <-streams
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.WriteMessage(ctx, []byte(`{"last":true}`)); err != nil {
		t.Fatal(err)
	}
	s.CloseWith(StatusGoingAway, "the bus is shutting down")
	if _, data, err := client.Read(ctx); err != nil || string(data) != `{"last":true}` {
		t.Fatalf("read %q, %v", data, err)
	}
	_, _, err := client.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != "the bus is shutting down" {
		t.Errorf("client read ended with %v, want 1001 and the reason", err)
	}
	// The library's ping waits for the pong, which a closed connection
	// never sends.
	if err := client.Ping(ctx); err == nil {
		t.Error("ping after the close succeeded")
	}
}

// TestPingFromLibraryClient: the bus answers a library client's ping.
func TestPingFromLibraryClient(t *testing.T) {
	t.Parallel()
	url, _ := serve(t, Options{MaxFrame: 1 << 20, Buffered: 10, WriteTimeout: time.Minute})
	client := dial(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx = client.CloseRead(ctx) // the library reads pongs only while something reads
	for range 3 {
		if err := client.Ping(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
	}
}

// TestMessagesAfterTheBusClosedAreDropped: once the bus has sent its close
// frame, what the peer sent before reading it is not handed on; the
// peer's close frame then ends the read and the connection.
func TestMessagesAfterTheBusClosedAreDropped(t *testing.T) {
	t.Parallel()
	url, streams := serveUnread(t, Options{MaxFrame: 1024, Buffered: 10, WriteTimeout: time.Minute})
	client := dialRaw(t, url, nil)
	s := <-streams
	s.CloseWith(StatusGoingAway, "bye")
	if op, p := client.frame(t); op != ws.OpClose || string(p) != "\x03\xe9bye" {
		t.Fatalf("server sent %v %q, want its close frame", op, p)
	}
	if _, err := client.c.Write(stream(text(`{"late":1}`), clientFrame{fin: true, op: 0x8, payload: []byte("\x03\xe9")})); err != nil {
		t.Fatal(err)
	}
	data, err := s.ReadMessage(context.Background())
	var cerr *CloseError
	if !errors.As(err, &cerr) || cerr.Code != ws.StatusGoingAway {
		t.Fatalf("ReadMessage: %q, %v; want the peer's close", data, err)
	}
	if _, err := client.br.ReadByte(); err != io.EOF {
		t.Errorf("after both close frames: %v, want the connection dropped", err)
	}
}
