package wsconn

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// frameKind is what reader.next found.
type frameKind int

const (
	kindMessage frameKind = iota
	kindPing
	kindPong
	kindClose
)

// protocolError is a peer's breach of RFC 6455 or of a limit: the
// connection is failed with code and reason in the close frame.
type protocolError struct {
	code   ws.StatusCode
	reason string
}

func (e *protocolError) Error() string {
	return fmt.Sprintf("wsconn: %s (close %d)", e.reason, e.code)
}

// CloseError is what ReadMessage returns once the peer closed the
// connection with a close frame.
type CloseError struct {
	Code   ws.StatusCode
	Reason string
}

func (e *CloseError) Error() string {
	return fmt.Sprintf("wsconn: the peer closed the connection: %d %q", e.Code, e.Reason)
}

// trustedPrealloc bounds what a frame's declared length may make the reader
// allocate before the bytes arrive: a peer that claims a large frame and
// sends it slowly holds no more than what it sent.
const trustedPrealloc = 32 << 10

// reader reads a client's frames (RFC 6455 section 5) from a buffered
// connection: it checks every header, unmasks payloads, joins fragmented
// messages, bounds a message by max, and returns control frames (which may
// come between the fragments of a message) as they arrive.
type reader struct {
	br  *bufio.Reader
	max int

	hdr [ws.MaxHeaderSize - 2]byte
	ctl [ws.MaxControlFramePayloadSize]byte
	// msg holds the fragments so far of a message sent in several frames;
	// fragmented says one is under way, and op is its type.
	msg        []byte
	fragmented bool
	op         ws.OpCode
}

// next returns the next whole message or control frame. A control frame's
// payload is only valid until the next call; a message's is the caller's.
// A breach of the protocol or of the size limit is a *protocolError; any
// other error is the connection's.
func (r *reader) next() (frameKind, []byte, error) {
	for {
		// Only an end before a frame is a clean one.
		if _, err := r.br.Peek(1); err != nil {
			return 0, nil, err
		}
		h, err := ws.ReadHeaderBuffer(r.br, r.hdr[:])
		if errors.Is(err, ws.ErrHeaderLengthMSB) || errors.Is(err, ws.ErrHeaderLengthUnexpected) {
			return 0, nil, &protocolError{ws.StatusProtocolError, "malformed frame length"}
		}
		if err != nil {
			return 0, nil, noEOF(err)
		}
		state := ws.StateServerSide
		if r.fragmented {
			state |= ws.StateFragmented
		}
		if err := ws.CheckHeader(h, state); err != nil {
			return 0, nil, &protocolError{ws.StatusProtocolError, err.Error()}
		}
		if h.OpCode.IsControl() {
			p := r.ctl[:h.Length]
			if _, err := io.ReadFull(r.br, p); err != nil {
				return 0, nil, noEOF(err)
			}
			ws.Cipher(p, h.Mask, 0)
			switch h.OpCode {
			case ws.OpPing:
				return kindPing, p, nil
			case ws.OpPong:
				return kindPong, p, nil
			default:
				return kindClose, p, nil
			}
		}
		if h.Length > int64(r.max-len(r.msg)) {
			return 0, nil, &protocolError{ws.StatusMessageTooBig, fmt.Sprintf("message over %d bytes", r.max)}
		}
		if !r.fragmented {
			r.op = h.OpCode
		}
		start := len(r.msg)
		if r.msg, err = r.appendPayload(r.msg, int(h.Length)); err != nil {
			return 0, nil, err
		}
		ws.Cipher(r.msg[start:], h.Mask, 0)
		r.fragmented = !h.Fin
		if r.fragmented {
			continue
		}
		msg := r.msg
		r.msg = nil
		if r.op == ws.OpText && !utf8.Valid(msg) {
			return 0, nil, &protocolError{ws.StatusInvalidFramePayloadData, "text message is not UTF-8"}
		}
		if msg == nil {
			msg = []byte{}
		}
		return kindMessage, msg, nil
	}
}

// appendPayload reads n bytes onto dst, growing it no faster than the
// bytes arrive beyond trustedPrealloc.
func (r *reader) appendPayload(dst []byte, n int) ([]byte, error) {
	for n > 0 {
		chunk := min(n, trustedPrealloc)
		dst = slices.Grow(dst, chunk)
		start := len(dst)
		dst = dst[:start+chunk]
		if _, err := io.ReadFull(r.br, dst[start:]); err != nil {
			return nil, noEOF(err)
		}
		n -= chunk
	}
	return dst, nil
}

// noEOF: a connection that ends inside a frame ended unexpectedly.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// closeFrameData parses a close frame's payload (RFC 6455 section 5.5.1):
// no code at all is 1005, which must then not be echoed.
func closeFrameData(p []byte) (ws.StatusCode, string, error) {
	switch len(p) {
	case 0:
		return ws.StatusNoStatusRcvd, "", nil
	case 1:
		return 0, "", &protocolError{ws.StatusProtocolError, "close frame with a one-byte payload"}
	}
	code, reason := ws.ParseCloseFrameData(p)
	if err := ws.CheckCloseFrameData(code, reason); err != nil {
		if errors.Is(err, ws.ErrProtocolInvalidUTF8) {
			return 0, "", &protocolError{ws.StatusInvalidFramePayloadData, err.Error()}
		}
		return 0, "", &protocolError{ws.StatusProtocolError, err.Error()}
	}
	return code, reason, nil
}
