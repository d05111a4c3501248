package jsonrpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/coder/websocket"
)

// DefaultMaxFrameSize bounds a frame when a stream is given no limit. It is
// far above any message the bus or ACP exchange, and low enough that a
// misbehaving peer cannot make us buffer without end.
const DefaultMaxFrameSize = 4 << 20

// ErrFrameTooLarge is returned, wrapped, by a stream that received a frame
// over its size limit. The stream cannot be trusted to find the next frame
// boundary after one, so the connection ends.
var ErrFrameTooLarge = errors.New("jsonrpc: frame too large")

// Stream carries whole frames: one JSON-RPC message or batch each.
//
// ReadMessage is called by one goroutine at a time, and returns a frame the
// caller may keep. WriteMessage may be called concurrently with itself and
// with ReadMessage; it does not keep data after returning. Its ctx bounds
// only the wait for other writers: it returns ctx's error only if it gave up
// before writing anything, because a frame abandoned half-written would
// corrupt the stream for every other caller. Close unblocks both.
type Stream interface {
	ReadMessage(ctx context.Context) ([]byte, error)
	WriteMessage(ctx context.Context, data []byte) error
	Close() error
}

// QueueingStream is a Stream that can also hold frames back, so that frames
// bound for one peer from several senders go out together, in one write,
// when one of them flushes. A fan-out queues a frame for each of its
// peers, then flushes each: frames other fan-outs queued meanwhile for the
// same peer share the write.
type QueueingStream interface {
	Stream
	// QueueMessage adds a frame to those waiting, without writing it; the
	// stream keeps data, which the caller must not change afterwards. It
	// waits, as WriteMessage does, only when no more frames may wait.
	QueueMessage(ctx context.Context, data []byte) error
	// Flush writes the waiting frames, unless a write under way will
	// (WriteMessage writes them too, ahead of its own frame). Frames are
	// written in the order they were queued or written.
	Flush() error
}

var (
	_ Stream = (*lineStream)(nil)
	_ Stream = (*wsStream)(nil)
)

func frameLimit(maxFrame int) int {
	if maxFrame <= 0 {
		return DefaultMaxFrameSize
	}
	return maxFrame
}

// writeLock serializes writers like a mutex, except that a writer can stop
// waiting when its context ends.
type writeLock chan struct{}

func (l writeLock) lock(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l writeLock) unlock() { <-l }

// lineStream frames messages as newline-delimited JSON, the framing of ACP
// and MCP over a child process's stdio.
type lineStream struct {
	r    *bufio.Reader
	rc   io.Closer // the reader, when closing it is what unblocks a read
	w    io.WriteCloser
	max  int
	wmu  writeLock
	wbuf []byte // guarded by wmu
}

// NewLineStream returns a stream of newline-delimited JSON reading from r and
// writing to w, such as a child process's stdout and stdin. Lines longer than
// maxFrame bytes (DefaultMaxFrameSize when zero or less) fail the stream
// with ErrFrameTooLarge. Close closes w, and r if it is an io.Closer.
func NewLineStream(r io.Reader, w io.WriteCloser, maxFrame int) Stream {
	s := &lineStream{
		r:   bufio.NewReaderSize(r, min(frameLimit(maxFrame)+1, 64<<10)),
		w:   w,
		max: frameLimit(maxFrame),
		wmu: make(writeLock, 1),
	}
	s.rc, _ = r.(io.Closer)
	return s
}

func (s *lineStream) ReadMessage(context.Context) ([]byte, error) {
	for {
		line, err := s.readLine()
		if err != nil {
			return nil, err
		}
		// Blank lines carry nothing; some peers end messages with CRLF.
		if line = trimSpace(line); len(line) > 0 {
			return line, nil
		}
	}
}

// readLine returns the next line without its newline, in memory the caller
// owns: decoded messages alias it, possibly while a handler still runs.
func (s *lineStream) readLine() ([]byte, error) {
	var long []byte // the line so far, once it spans more than one buffer
	for {
		chunk, err := s.r.ReadSlice('\n')
		n := len(long) + len(chunk)
		if err == nil {
			n-- // the newline does not count
		}
		if n > s.max {
			return nil, fmt.Errorf("%w: line over %d bytes", ErrFrameTooLarge, s.max)
		}
		switch {
		case err == nil:
			if long == nil {
				return bytes.Clone(chunk[:len(chunk)-1]), nil
			}
			return append(long, chunk[:len(chunk)-1]...), nil
		case errors.Is(err, bufio.ErrBufferFull):
			long = append(long, chunk...)
		case errors.Is(err, io.EOF) && n > 0:
			// A last line without a newline is still a line; the next read
			// reports the EOF.
			return append(long, chunk...), nil
		default:
			return nil, err
		}
	}
}

func (s *lineStream) WriteMessage(ctx context.Context, data []byte) error {
	if err := s.wmu.lock(ctx); err != nil {
		return err
	}
	defer s.wmu.unlock()
	if bytes.IndexByte(data, '\n') >= 0 {
		// Only whitespace can hold a raw newline in JSON, so compacting makes
		// the frame one line without changing it.
		buf := bytes.NewBuffer(s.wbuf[:0])
		if err := json.Compact(buf, data); err != nil {
			return fmt.Errorf("jsonrpc: frame is not valid JSON: %w", err)
		}
		s.wbuf = buf.Bytes()
	} else {
		s.wbuf = append(s.wbuf[:0], data...)
	}
	// One Write per frame: a pipe then carries it whole, without
	// interleaving with another process writing to the same pipe.
	_, err := s.w.Write(append(s.wbuf, '\n'))
	if cap(s.wbuf) > 64<<10 {
		s.wbuf = nil // do not pin one huge frame's memory for the stream's life
	}
	return err
}

func (s *lineStream) Close() error {
	err := s.w.Close()
	if s.rc != nil {
		err = errors.Join(err, s.rc.Close())
	}
	return err
}

// wsStream carries one frame per WebSocket text message.
type wsStream struct {
	c   *websocket.Conn
	max int
	wmu writeLock
}

// NewWebSocketStream returns a stream over c that sends each frame as a text
// message. Messages over maxFrame bytes (DefaultMaxFrameSize when zero or
// less) fail the stream with ErrFrameTooLarge; the WebSocket is then closed
// with status 1009 (message too big).
func NewWebSocketStream(c *websocket.Conn, maxFrame int) Stream {
	s := &wsStream{c: c, max: frameLimit(maxFrame), wmu: make(writeLock, 1)}
	c.SetReadLimit(int64(s.max))
	return s
}

func (s *wsStream) ReadMessage(ctx context.Context) ([]byte, error) {
	// The message type is not checked: a peer that sends its JSON as a binary
	// message still sends JSON.
	_, data, err := s.c.Read(ctx)
	if errors.Is(err, websocket.ErrMessageTooBig) {
		return nil, fmt.Errorf("%w: websocket message over %d bytes", ErrFrameTooLarge, s.max)
	}
	return data, err
}

func (s *wsStream) WriteMessage(ctx context.Context, data []byte) error {
	if err := s.wmu.lock(ctx); err != nil {
		return err
	}
	defer s.wmu.unlock()
	// Not ctx: the websocket library closes the connection when the context
	// of a write in progress ends, and one caller giving up must not end the
	// connection for all.
	return s.c.Write(context.Background(), websocket.MessageText, data)
}

func (s *wsStream) Close() error {
	return s.c.Close(websocket.StatusNormalClosure, "")
}
