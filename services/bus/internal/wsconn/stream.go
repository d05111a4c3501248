// Package wsconn carries JSON-RPC frames over a WebSocket (RFC 6455, the
// server's side) with a bounded outbound buffer, so that one client that
// stops reading can neither block the publishers delivering to it nor hold
// memory without bound: when its buffer is full, it is disconnected with a
// close code and a reason.
//
// It is built for many mostly idle connections and for fan-out: an idle
// stream holds no goroutine of its own and no write buffer. A frame is
// written by the goroutine that sends it when no other write is under way;
// frames sent meanwhile queue up and are written together, in one system
// call, by a goroutine started for as long as the queue lasts. A fan-out
// can also queue a frame without writing (QueueMessage) and Flush once it
// has gone round its peers, so that what several fan-outs send one peer
// meanwhile goes out in one write. The framing is the bus's own, over
// github.com/gobwas/ws's header checks and unmasking, because a general
// WebSocket library's per-message reads and writes cost the bus's fan-out
// twice what nats-server spends per delivery (bench/bus/README.md).
package wsconn

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// StatusCode is a WebSocket close code (RFC 6455 section 7.4).
type StatusCode = ws.StatusCode

const (
	// StatusSlowReader closes a connection whose outbound buffer filled
	// up: 1008, policy violation, with a reason saying so.
	StatusSlowReader = ws.StatusPolicyViolation
	// StatusGoingAway closes connections when the server shuts down.
	StatusGoingAway = ws.StatusGoingAway
)

// ErrSlowReader is returned by writes to a stream whose peer stopped reading.
var ErrSlowReader = errors.New("wsconn: the peer is not reading; outbound buffer full")

var errClosed = errors.New("wsconn: stream closed")

// readBufferSize is the buffer each connection reads through. Payloads
// larger than it are read straight into the message, so it only needs to
// hold a frame header and a typical small frame; it is held for the
// connection's life, idle or not.
const readBufferSize = 256

// closeTimeout bounds the wait for the peer's close frame after the bus
// sent its own; then the connection is dropped.
const closeTimeout = 5 * time.Second

// Options configures a Stream.
type Options struct {
	// MaxFrame bounds a received message; a larger one closes the
	// connection with 1009.
	MaxFrame int
	// Buffered frames may wait to be written; WriteTimeout bounds both a
	// wait for room in a full buffer and one write to the socket. Past
	// either, the peer is not reading and the connection ends.
	Buffered     int
	WriteTimeout time.Duration
	// OnClose runs once, when the stream is closed.
	OnClose func()
}

// outFrame is a frame waiting to be written.
type outFrame struct {
	op      ws.OpCode
	payload []byte
}

// Stream is a jsonrpc.Stream over a WebSocket.
type Stream struct {
	conn net.Conn
	in   reader
	opts Options

	mu sync.Mutex
	// queue holds the frames waiting while another is written.
	queue []outFrame
	// pong answers the latest ping not yet answered (RFC 6455 section
	// 5.5.3 lets the others go unanswered); written ahead of the queue.
	pong        []byte
	pongPending bool
	// writing: some goroutine owns the connection's write side (writing,
	// or closing it); others queue.
	writing bool
	// room is closed when the queue is taken or the stream closed, waking
	// senders waiting for room; made only when one waits.
	room        chan struct{}
	closed      bool
	closeStatus StatusCode
	closeReason string
	// sentClose and gotClose track the close handshake: once both close
	// frames have passed, the connection is dropped.
	sentClose, gotClose bool
	// broken: a write failed, perhaps in the middle of a frame, so the
	// peer could not read a close frame: the connection is dropped.
	broken bool
	// failing: the peer broke the protocol, so nothing more is read from
	// it; the close frame is followed by the end of the bus's side of the
	// connection instead of a wait for the peer's close frame.
	failing bool
}

var _ jsonrpc.QueueingStream = (*Stream)(nil)

// Accept upgrades the request to a WebSocket stream, or answers it with an
// HTTP error in the bus's JSON shape and returns an error.
func Accept(w http.ResponseWriter, r *http.Request, opts Options) (*Stream, error) {
	conn, br, err := upgrade(w, r)
	if err != nil {
		return nil, err
	}
	return newStream(conn, br, opts), nil
}

func newStream(conn net.Conn, br *bufio.Reader, opts Options) *Stream {
	if opts.MaxFrame <= 0 {
		opts.MaxFrame = jsonrpc.DefaultMaxFrameSize
	}
	return &Stream{conn: conn, in: reader{br: br, max: opts.MaxFrame}, opts: opts, closeStatus: ws.StatusNormalClosure}
}

// ReadMessage implements jsonrpc.Stream. It answers pings as they come,
// and ends the connection when the peer closes it or breaks the protocol.
func (s *Stream) ReadMessage(ctx context.Context) ([]byte, error) {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = s.conn.SetReadDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	for {
		kind, p, err := s.in.next()
		if err != nil {
			return nil, s.readFailed(err)
		}
		switch kind {
		case kindMessage:
			s.mu.Lock()
			closing := s.closed
			s.mu.Unlock()
			if closing {
				// The bus has closed the connection: what the peer sent
				// before it read the close frame is not acted on.
				continue
			}
			return p, nil
		case kindPing:
			s.answerPing(p)
		case kindClose:
			code, reason, err := closeFrameData(p)
			if err != nil {
				return nil, s.readFailed(err)
			}
			s.peerClosed(code)
			return nil, &CloseError{Code: code, Reason: reason}
		}
	}
}

// readFailed ends the connection after a read error: a breach of the
// protocol or of the size limit gets a close frame saying so, a broken
// connection none.
func (s *Stream) readFailed(err error) error {
	var perr *protocolError
	if !errors.As(err, &perr) {
		s.mu.Lock()
		s.gotClose = true // nothing more can be read: do not wait for it
		s.mu.Unlock()
		_ = s.conn.Close()
		_ = s.Close()
		return err
	}
	s.mu.Lock()
	s.failing = true
	s.mu.Unlock()
	s.fail(perr.code, perr.reason)
	if perr.code == ws.StatusMessageTooBig {
		return fmt.Errorf("%w: websocket message over %d bytes", jsonrpc.ErrFrameTooLarge, s.opts.MaxFrame)
	}
	return err
}

// answerPing queues a pong with the ping's payload, replacing one not yet
// written, and writes it unless a write under way will.
func (s *Stream) answerPing(p []byte) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.pong = append(s.pong[:0], p...)
	s.pongPending = true
	if s.writing {
		s.mu.Unlock()
		return
	}
	s.writing = true
	batch := s.takeQueue()
	s.mu.Unlock()
	_ = s.write(batch)
}

// peerClosed answers the peer's close frame: with the same code (none for
// 1005), after what is already queued, and then drops the connection.
func (s *Stream) peerClosed(code StatusCode) {
	s.mu.Lock()
	s.gotClose = true
	sent := s.sentClose
	s.mu.Unlock()
	if sent {
		_ = s.conn.Close()
		return
	}
	s.fail(code, "")
}

// WriteMessage writes a frame, or queues it while another write is under
// way. When the queue is full it waits for room, so a burst (every pending
// call failing at once) passes, but not for longer than the write timeout:
// a peer that lets the queue stay full that long is not reading, and the
// connection ends.
func (s *Stream) WriteMessage(ctx context.Context, data []byte) error {
	var timeout <-chan time.Time
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return errClosed
		}
		if !s.writing {
			break
		}
		if len(s.queue) < s.opts.Buffered {
			s.queue = append(s.queue, outFrame{ws.OpText, bytes.Clone(data)}) // the caller may reuse data
			s.mu.Unlock()
			return nil
		}
		if s.room == nil {
			s.room = make(chan struct{})
		}
		room := s.room
		s.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(s.opts.WriteTimeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err() // nothing was written: the frame is simply not sent
		case <-timeout:
			s.fail(StatusSlowReader, "slow reader: outbound buffer full")
			return ErrSlowReader
		}
		s.mu.Lock()
	}
	s.writing = true
	// Frames queued for a Flush go first, with this one.
	b := s.takeQueue()
	var one [1]outFrame // no queue, the usual case: no allocation
	if b == nil {
		b = one[:0]
	}
	b = append(b, outFrame{ws.OpText, data})
	s.mu.Unlock()

	if err := s.write(b); err != nil {
		return ErrSlowReader
	}
	return nil
}

// QueueMessage implements jsonrpc.QueueingStream: it adds a frame to the
// queue, to be written by the next Flush or write. When the queue is full
// it waits as WriteMessage does.
func (s *Stream) QueueMessage(ctx context.Context, data []byte) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	if len(s.queue) < s.opts.Buffered {
		s.queue = append(s.queue, outFrame{ws.OpText, data})
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return s.WriteMessage(ctx, data)
}

// Flush implements jsonrpc.QueueingStream: it writes the queue in one
// system call, unless the queue is empty or a write under way will write
// it.
func (s *Stream) Flush() error {
	s.mu.Lock()
	if s.closed || s.writing || len(s.queue) == 0 && !s.pongPending {
		s.mu.Unlock()
		return nil
	}
	s.writing = true
	b := s.takeQueue()
	s.mu.Unlock()
	if err := s.write(b); err != nil {
		return ErrSlowReader
	}
	return nil
}

// takeQueue returns the frames to write next, the pending pong first, and
// empties the queue, waking senders waiting for room. s.mu is held.
func (s *Stream) takeQueue() []outFrame {
	b := s.queue
	if s.pongPending {
		b = append([]outFrame{{ws.OpPong, bytes.Clone(s.pong)}}, b...)
		s.pongPending = false
	}
	s.queue = nil
	if s.room != nil {
		close(s.room)
		s.room = nil
	}
	return b
}

// write writes a batch as the write side's owner, then leaves what was
// queued meanwhile to a goroutine, so the sender does not wait for
// frames others sent.
func (s *Stream) write(b []outFrame) error {
	err := s.writeBatch(b)
	if next, more := s.afterBatch(err); more {
		go s.drain(next)
	}
	return err
}

// drain writes queued frames until the queue is empty, as the owner of
// the write side.
func (s *Stream) drain(b []outFrame) {
	for more := true; more; {
		b, more = s.afterBatch(s.writeBatch(b))
	}
}

// writeBatch frames a batch and writes it in one system call (a vectored
// write when it carries large payloads, which are not copied).
func (s *Stream) writeBatch(b []outFrame) error {
	w := getFrameBuffer()
	defer w.release()
	for _, f := range b {
		w.add(f.op, f.payload)
	}
	if err := s.conn.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout)); err != nil {
		return err
	}
	return w.writeTo(s.conn)
}

// afterBatch is called by the write side's owner after a batch: it returns
// the next batch to write, or false when the owner is done, having released
// the write side or handed it to the close handshake.
func (s *Stream) afterBatch(err error) ([]outFrame, bool) {
	if err != nil {
		s.mu.Lock()
		s.broken = true
		s.mu.Unlock()
		s.fail(StatusSlowReader, "slow reader: write timed out")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		go s.finish()
		return nil, false
	}
	if len(s.queue) == 0 && !s.pongPending {
		s.writing = false
		return nil, false
	}
	return s.takeQueue(), true
}

// finish writes what is still queued, unless the peer is the reason for
// closing, then sends the close frame. It runs as the write side's owner.
// The connection is dropped once the peer's close frame is read as well,
// or closeTimeout after, or at once if the close frame could not be sent.
func (s *Stream) finish() {
	s.mu.Lock()
	status, reason, broken := s.closeStatus, s.closeReason, s.broken
	rest := s.takeQueue()
	s.mu.Unlock()
	if broken {
		_ = s.conn.Close()
		return
	}
	if status == StatusSlowReader {
		rest = nil
	}
	rest = append(rest, outFrame{ws.OpClose, closePayload(status, reason)})
	err := s.writeBatch(rest)
	s.mu.Lock()
	s.sentClose = true
	got, failing := s.gotClose, s.failing
	s.mu.Unlock()
	if err != nil || got {
		_ = s.conn.Close()
		return
	}
	if hc, ok := s.conn.(interface{ CloseWrite() error }); failing && ok {
		// Closing outright could reset the connection, with the close
		// frame unread, if the peer's bytes wait unread: end the bus's
		// side only, and let the peer close its own.
		_ = hc.CloseWrite()
	}
	time.AfterFunc(closeTimeout, func() { _ = s.conn.Close() })
}

// closePayload is a close frame's payload: no code for 1005 (RFC 6455
// section 7.4.1: it is never sent), the reason cut to fit in a control
// frame at a character boundary.
func closePayload(status StatusCode, reason string) []byte {
	if status == ws.StatusNoStatusRcvd {
		return nil
	}
	const room = ws.MaxControlFramePayloadSize - 2
	for len(reason) > room {
		_, size := utf8.DecodeLastRuneInString(reason)
		reason = reason[:len(reason)-size]
	}
	return ws.NewCloseFrameBody(status, reason)
}

// fail records why the connection ends; Close then uses it.
func (s *Stream) fail(status StatusCode, reason string) {
	s.mu.Lock()
	if s.closeStatus == ws.StatusNormalClosure {
		s.closeStatus, s.closeReason = status, reason
	}
	s.mu.Unlock()
	_ = s.Close()
}

// CloseWith closes the connection with a status and reason.
func (s *Stream) CloseWith(status StatusCode, reason string) {
	s.fail(status, reason)
}

// Close implements jsonrpc.Stream. It returns at once: what is queued is
// written and the close handshake run in the background, as a peer that
// does not read would otherwise hold the caller for the write timeout.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.room != nil {
		close(s.room)
		s.room = nil
	}
	idle := !s.writing
	s.writing = true // from now on the write side belongs to finish
	s.mu.Unlock()
	if idle {
		go s.finish()
	} // else the current owner starts finish after its batch
	if s.opts.OnClose != nil {
		s.opts.OnClose()
	}
	return nil
}
