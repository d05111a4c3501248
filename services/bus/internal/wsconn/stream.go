// Package wsconn carries JSON-RPC frames over a WebSocket with a bounded
// outbound buffer, so that one client that stops reading can neither block
// the publishers delivering to it nor hold memory without bound: when its
// buffer is full, it is disconnected with a close code and a reason.
package wsconn

import (
	"context"
	"errors"
	"fmt"
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

// Stream is a jsonrpc.Stream over a WebSocket.
type Stream struct {
	c            *websocket.Conn
	max          int
	out          chan []byte
	writeTimeout time.Duration

	closeOnce   sync.Once
	closed      chan struct{}
	mu          sync.Mutex
	closeStatus websocket.StatusCode
	closeReason string
}

var _ jsonrpc.Stream = (*Stream)(nil)

// New returns a stream over c. Frames over maxFrame bytes close the
// connection with 1009; at most buffered frames wait to be written, and a
// full buffer or one write that stays stuck for writeTimeout means the peer
// is not reading.
func New(c *websocket.Conn, maxFrame, buffered int, writeTimeout time.Duration) *Stream {
	c.SetReadLimit(int64(maxFrame))
	s := &Stream{c: c, max: maxFrame, out: make(chan []byte, buffered), writeTimeout: writeTimeout,
		closed: make(chan struct{}), closeStatus: websocket.StatusNormalClosure}
	go s.writer()
	return s
}

// ReadMessage implements jsonrpc.Stream.
func (s *Stream) ReadMessage(ctx context.Context) ([]byte, error) {
	_, data, err := s.c.Read(ctx)
	if errors.Is(err, websocket.ErrMessageTooBig) {
		return nil, fmt.Errorf("%w: websocket message over %d bytes", jsonrpc.ErrFrameTooLarge, s.max)
	}
	return data, err
}

// WriteMessage queues a frame. When the buffer is full it waits for room,
// so a burst (every pending call failing at once) passes, but not for
// longer than the write timeout: a peer that lets the buffer stay full
// that long is not reading, and the connection ends.
func (s *Stream) WriteMessage(ctx context.Context, data []byte) error {
	frame := append([]byte(nil), data...) // the caller may reuse data
	select {
	case <-s.closed:
		return errClosed
	case s.out <- frame:
		return nil
	default:
	}
	t := time.NewTimer(s.writeTimeout)
	defer t.Stop()
	select {
	case s.out <- frame:
		return nil
	case <-s.closed:
		return errClosed
	case <-ctx.Done():
		return ctx.Err() // nothing was written: the frame is simply not sent
	case <-t.C:
		s.fail(StatusSlowReader, "slow reader: outbound buffer full")
		return ErrSlowReader
	}
}

func (s *Stream) writer() {
	for {
		select {
		case <-s.closed:
			s.finish()
			return
		case frame := <-s.out:
			if !s.write(frame) {
				s.fail(StatusSlowReader, "slow reader: write timed out")
				s.finish()
				return
			}
		}
	}
}

func (s *Stream) write(frame []byte) bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.writeTimeout)
	defer cancel()
	return s.c.Write(ctx, websocket.MessageText, frame) == nil
}

// finish writes what is still buffered, unless the peer is the reason for
// closing, then runs the close handshake.
func (s *Stream) finish() {
	s.mu.Lock()
	status, reason := s.closeStatus, s.closeReason
	s.mu.Unlock()
	if status != StatusSlowReader {
	flush:
		for {
			select {
			case frame := <-s.out:
				if !s.write(frame) {
					break flush
				}
			default:
				break flush
			}
		}
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

// Close implements jsonrpc.Stream. It returns at once: the writer flushes
// what is buffered and runs the close handshake in the background, as a
// peer that does not read would otherwise hold the caller for the
// library's handshake timeout.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}
