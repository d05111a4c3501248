// Package wsconn carries JSON-RPC frames over a WebSocket with a bounded
// outbound buffer, so that one client that stops reading can neither block
// the publishers delivering to it nor hold memory without bound: when its
// buffer is full, it is disconnected with a close code and a reason.
//
// It is built for many mostly idle connections: an idle stream holds no
// goroutine of its own and no write buffer. A frame is written by the
// goroutine that sends it when no other write is under way; frames sent
// meanwhile queue up and are written together, in one system call, by a
// goroutine started for as long as the queue lasts. A fan-out can also
// queue a frame without writing (QueueMessage) and Flush once it has gone
// round its peers, so that what several fan-outs send one peer meanwhile
// goes out in one write.
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

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// StatusSlowReader closes a connection whose outbound buffer filled up:
// 1008, policy violation, with a reason saying so.
const StatusSlowReader = websocket.StatusPolicyViolation

// ErrSlowReader is returned by writes to a stream whose peer stopped reading.
var ErrSlowReader = errors.New("wsconn: the peer is not reading; outbound buffer full")

var errClosed = errors.New("wsconn: stream closed")

// readBufferSize is the buffer each connection reads through. Frames
// larger than it are read straight into the message, so it only needs to
// hold a frame header and a typical small frame; it is held for the
// connection's life, idle or not.
const readBufferSize = 256

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

// Stream is a jsonrpc.Stream over a WebSocket.
type Stream struct {
	c    *websocket.Conn
	out  *batchWriter
	opts Options

	mu sync.Mutex
	// queue holds the frames waiting while another is written.
	queue [][]byte
	// writing: some goroutine owns the connection's write side (writing,
	// or closing it); others queue.
	writing bool
	// room is closed when the queue is taken or the stream closed, waking
	// senders waiting for room; made only when one waits.
	room        chan struct{}
	closed      bool
	closeStatus websocket.StatusCode
	closeReason string
}

var _ jsonrpc.QueueingStream = (*Stream)(nil)

// Accept upgrades the request to a WebSocket stream. It reads through a
// small buffer and writes through a batching writer instead of the 4 KiB
// buffers net/http hands over with a hijacked connection, which would
// otherwise stay allocated for every idle connection.
func Accept(w http.ResponseWriter, r *http.Request, opts Options) (*Stream, error) {
	out := &batchWriter{timeout: opts.WriteTimeout}
	c, err := websocket.Accept(&smallBuffers{ResponseWriter: w, out: out}, r, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(int64(opts.MaxFrame))
	return &Stream{c: c, out: out, opts: opts, closeStatus: websocket.StatusNormalClosure}, nil
}

// readBuffers are what messages are read into before being copied out at
// their size: the library's own Read starts every message with 512 bytes,
// ten times a typical answer, which is garbage to collect per frame.
var readBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// ReadMessage implements jsonrpc.Stream.
func (s *Stream) ReadMessage(ctx context.Context) ([]byte, error) {
	_, r, err := s.c.Reader(ctx)
	if err == nil {
		buf := readBuffers.Get().(*bytes.Buffer)
		buf.Reset()
		_, err = buf.ReadFrom(r)
		data := bytes.Clone(buf.Bytes())
		if buf.Cap() <= maxPooled {
			readBuffers.Put(buf)
		}
		if err == nil {
			return data, nil
		}
	}
	if errors.Is(err, websocket.ErrMessageTooBig) {
		return nil, fmt.Errorf("%w: websocket message over %d bytes", jsonrpc.ErrFrameTooLarge, s.opts.MaxFrame)
	}
	return nil, err
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
			s.queue = append(s.queue, bytes.Clone(data)) // the caller may reuse data
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
	var one [1][]byte
	batch := one[:0]
	if len(s.queue) > 0 {
		batch = s.takeQueue()
	}
	batch = append(batch, data)
	s.mu.Unlock()

	if err := s.write(batch); err != nil {
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
		s.queue = append(s.queue, data)
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
	if s.closed || s.writing || len(s.queue) == 0 {
		s.mu.Unlock()
		return nil
	}
	s.writing = true
	batch := s.takeQueue()
	s.mu.Unlock()
	if err := s.write(batch); err != nil {
		return ErrSlowReader
	}
	return nil
}

// takeQueue returns the queued frames and empties the queue, waking
// senders waiting for room. s.mu is held.
func (s *Stream) takeQueue() [][]byte {
	q := s.queue
	s.queue = nil
	if s.room != nil {
		close(s.room)
		s.room = nil
	}
	return q
}

// write writes a batch as the write side's owner, then leaves what was
// queued meanwhile to a goroutine, so the sender does not wait for
// frames others sent.
func (s *Stream) write(batch [][]byte) error {
	err := s.writeBatch(batch)
	if next := s.afterBatch(err); next != nil {
		go s.drain(next)
	}
	return err
}

// drain writes queued frames until the queue is empty, as the owner of
// the write side.
func (s *Stream) drain(batch [][]byte) {
	for batch != nil {
		batch = s.afterBatch(s.writeBatch(batch))
	}
}

// writeBatch writes frames as WebSocket messages in one system call.
func (s *Stream) writeBatch(frames [][]byte) error {
	s.out.cork()
	for _, f := range frames {
		// The library's own context handling is not needed: the batch
		// writer bounds the socket write with a deadline.
		if err := s.c.Write(context.Background(), websocket.MessageText, f); err != nil {
			_ = s.out.flush()
			return err
		}
	}
	return s.out.flush()
}

// afterBatch is called by the write side's owner after a batch: it returns
// the next batch to write, or nil when the owner is done, having released
// the write side or handed it to the close handshake.
func (s *Stream) afterBatch(err error) [][]byte {
	if err != nil {
		s.fail(StatusSlowReader, "slow reader: write timed out")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		go s.finish()
		return nil
	}
	if len(s.queue) == 0 {
		s.writing = false
		return nil
	}
	return s.takeQueue()
}

// finish writes what is still queued, unless the peer is the reason for
// closing, then runs the close handshake. It runs as the write side's
// owner.
func (s *Stream) finish() {
	s.mu.Lock()
	status, reason, rest := s.closeStatus, s.closeReason, s.queue
	s.queue = nil
	s.mu.Unlock()
	if status != StatusSlowReader && len(rest) > 0 {
		_ = s.writeBatch(rest)
	}
	_ = s.c.Close(status, reason)
}

// fail records why the connection ends; Close then uses it.
func (s *Stream) fail(status websocket.StatusCode, reason string) {
	s.mu.Lock()
	if s.closeStatus == websocket.StatusNormalClosure {
		s.closeStatus, s.closeReason = status, reason
	}
	s.mu.Unlock()
	_ = s.Close()
}

// CloseWith closes the connection with a status and reason.
func (s *Stream) CloseWith(status websocket.StatusCode, reason string) {
	s.fail(status, reason)
}

// Close implements jsonrpc.Stream. It returns at once: what is queued is
// written and the close handshake run in the background, as a peer that
// does not read would otherwise hold the caller for the library's
// handshake timeout.
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

// smallBuffers hands the WebSocket library the hijacked connection with a
// small read buffer and the batching writer.
type smallBuffers struct {
	http.ResponseWriter
	out *batchWriter
}

func (h *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// Bytes the client sent after its upgrade request are already in
	// net/http's buffer: they must come first in ours.
	early, _ := brw.Reader.Peek(brw.Reader.Buffered())
	r := bufio.NewReaderSize(bytes.NewReader(bytes.Clone(early)), max(readBufferSize, len(early)))
	_, _ = r.Peek(len(early))
	h.out.conn = conn
	// The library writes a frame's header and payload, then flushes; the
	// batch writer collects both, so this buffer only needs a header (at
	// most 14 bytes).
	return conn, bufio.NewReadWriter(r, bufio.NewWriterSize(h.out, 16)), nil
}

func (h *smallBuffers) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// batchWriter is what the WebSocket library's writes go through. Corked,
// it collects them in a pooled buffer that flush writes in one system
// call; uncorked (the library answering a ping or closing on its own), it
// writes through. Every socket write has the write timeout as deadline.
type batchWriter struct {
	conn    net.Conn
	timeout time.Duration

	mu     sync.Mutex
	corked bool
	buf    *[]byte
}

// maxPooled bounds the batch buffers kept for reuse, so that one large
// frame does not pin its memory.
const maxPooled = 64 << 10

var batchBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func (w *batchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.corked {
		*w.buf = append(*w.buf, p...)
		return len(p), nil
	}
	return w.writeThrough(p)
}

func (w *batchWriter) writeThrough(p []byte) (int, error) {
	if err := w.conn.SetWriteDeadline(time.Now().Add(w.timeout)); err != nil {
		return 0, err
	}
	return w.conn.Write(p)
}

func (w *batchWriter) cork() {
	w.mu.Lock()
	w.corked = true
	w.buf = batchBuffers.Get().(*[]byte)
	w.mu.Unlock()
}

func (w *batchWriter) flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.corked = false
	buf := w.buf
	w.buf = nil
	var err error
	if len(*buf) > 0 {
		_, err = w.writeThrough(*buf)
	}
	if cap(*buf) <= maxPooled {
		*buf = (*buf)[:0]
		batchBuffers.Put(buf)
	}
	return err
}
