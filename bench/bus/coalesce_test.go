package bus

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// startFanOut is the least WebSocket fan-out, the floor the bus is measured
// against: a server that writes each publisher frame, as it came, to every
// subscriber, and answers the publisher once every subscriber has
// answered. With coalesce, each connection has one writer that puts every
// frame queued for it since its last write into one write(2), as
// nats-server's write loop flushes a client: that is the floor. Without,
// each frame is its own write(2): a reference, not a floor, since the bus
// and nats-server both coalesce. Nothing else: no JSON-RPC beyond finding
// a frame's id, no routing, no policies, no limits, nothing kept.
// Subscribers connect with ?role=sub; their first two frames (the bus's
// initialize and subscribe) get an empty result. Only what the bench's
// clients send is understood: unfragmented, masked text frames, and a
// close.
func startFanOut(b *testing.B, coalesce bool) string {
	b.Helper()
	type waiting struct {
		left atomic.Int32
		pub  *frameWriter
	}
	var (
		mu      sync.Mutex
		subs    []*frameWriter
		pending = map[string]*waiting{}
	)
	answer := func(w *frameWriter, id []byte) {
		w.enqueue(textFrame(append(append([]byte(`{"jsonrpc":"2.0","id":`), id...), `,"result":{}}`...)))
	}
	serve := func(c net.Conn) {
		defer func() { _ = c.Close() }()
		br := bufio.NewReaderSize(c, 64<<10)
		sub, err := acceptWebSocket(c, br)
		if err != nil {
			return
		}
		w := newFrameWriter(c, coalesce)
		defer w.close()
		if sub {
			for i := range 2 {
				data, err := readFrame(br)
				if err != nil {
					return
				}
				if i == 1 {
					mu.Lock()
					subs = append(subs, w)
					mu.Unlock()
				}
				answer(w, frameID(data))
			}
			for {
				data, err := readFrame(br)
				if err != nil {
					return
				}
				id := string(frameID(data))
				mu.Lock()
				p := pending[id]
				if p != nil && p.left.Add(-1) == 0 {
					delete(pending, id)
				} else {
					p = nil
				}
				mu.Unlock()
				if p != nil {
					answer(p.pub, []byte(id))
				}
			}
		}
		for {
			data, err := readFrame(br)
			if err != nil {
				return
			}
			frame := textFrame(data)
			mu.Lock()
			to := subs
			p := &waiting{pub: w}
			p.left.Store(int32(len(to)))
			pending[string(frameID(data))] = p
			mu.Unlock()
			for _, s := range to {
				s.enqueue(frame)
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	asServer(func() {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go serve(c)
			}
		}()
	})
	b.Cleanup(func() { _ = l.Close() })
	return "ws://" + l.Addr().String()
}

// acceptWebSocket answers a WebSocket upgrade (RFC 6455 section 4.2) and
// tells whether the client asked for the subscriber's role.
func acceptWebSocket(c net.Conn, br *bufio.Reader) (sub bool, err error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false, err
	}
	key := req.Header.Get("Sec-WebSocket-Key")
	if key == "" {
		return false, errors.New("not a WebSocket upgrade")
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	_, err = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "+
		base64.StdEncoding.EncodeToString(sum[:])+"\r\n\r\n")
	return req.URL.Query().Get("role") == "sub", err
}

// readFrame reads one client frame and returns its payload, unmasked; a
// close frame, or anything this floor does not handle, ends the read.
func readFrame(br *bufio.Reader) ([]byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, err
	}
	if h[0] != 0x81 || h[1]&0x80 == 0 { // FIN and text; masked
		return nil, errors.New("frame not handled by the floor")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			return nil, err
		}
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		if _, err := io.ReadFull(br, l[:]); err != nil {
			return nil, err
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	if n > 1<<20 {
		return nil, errors.New("frame too large for the floor")
	}
	var mask [4]byte
	if _, err := io.ReadFull(br, mask[:]); err != nil {
		return nil, err
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(br, data); err != nil {
		return nil, err
	}
	for i := range data {
		data[i] ^= mask[i&3]
	}
	return data, nil
}

// textFrame is payload as one unmasked server text frame.
func textFrame(payload []byte) []byte {
	n := len(payload)
	var f []byte
	switch {
	case n < 126:
		f = append(make([]byte, 0, 2+n), 0x81, byte(n))
	case n < 1<<16:
		f = append(make([]byte, 0, 4+n), 0x81, 126, byte(n>>8), byte(n))
	default:
		f = binary.BigEndian.AppendUint64(append(make([]byte, 0, 10+n), 0x81, 127), uint64(n))
	}
	return append(f, payload...)
}

// frameWriter writes a connection's frames. Coalescing, it writes from one
// goroutine, all those queued since its last write in one write(2), as
// nats-server's write loop flushes a client's outbound buffer; otherwise
// each frame is written at once, one write(2) each.
type frameWriter struct {
	c        net.Conn
	coalesce bool
	mu       sync.Mutex
	queued   []byte
	closed   bool
	wake     chan struct{}
}

func newFrameWriter(c net.Conn, coalesce bool) *frameWriter {
	w := &frameWriter{c: c, coalesce: coalesce, wake: make(chan struct{}, 1)}
	if coalesce {
		go w.loop()
	}
	return w
}

func (w *frameWriter) enqueue(frame []byte) {
	w.mu.Lock()
	if !w.coalesce {
		// A failed write shows as the connection's end to its reader.
		_, _ = w.c.Write(frame)
		w.mu.Unlock()
		return
	}
	w.queued = append(w.queued, frame...)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *frameWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *frameWriter) loop() {
	var out []byte
	for range w.wake {
		w.mu.Lock()
		out, w.queued = w.queued, out[:0]
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return
		}
		if len(out) > 0 {
			if _, err := w.c.Write(out); err != nil {
				return
			}
		}
	}
}
