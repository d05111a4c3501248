package wsconn

import (
	"encoding/binary"
	"io"
	"net"
	"sync"

	"github.com/gobwas/ws"
)

// copyLimit: payloads up to it are copied behind their header into one
// buffer; larger ones are written from where they are, in a vectored
// write, as copying them would cost more than another iovec.
const copyLimit = 2 << 10

// maxPooled bounds the frame buffers kept for reuse, so that one large
// batch does not pin its memory.
const maxPooled = 64 << 10

// frameBuffer frames a batch of server frames (unmasked, RFC 6455 section
// 5.2) for one write.
type frameBuffer struct {
	buf []byte
	// iov holds the batch's pieces once a payload is not copied: buf's
	// bytes up to mark, that payload, and so on.
	iov  net.Buffers
	mark int
}

var frameBuffers = sync.Pool{New: func() any { return &frameBuffer{buf: make([]byte, 0, 4096)} }}

func getFrameBuffer() *frameBuffer { return frameBuffers.Get().(*frameBuffer) }

func (w *frameBuffer) release() {
	if cap(w.buf) > maxPooled {
		return
	}
	w.buf, w.mark = w.buf[:0], 0
	clear(w.iov) // do not keep the payloads alive
	w.iov = w.iov[:0]
	frameBuffers.Put(w)
}

// add appends one whole frame.
func (w *frameBuffer) add(op ws.OpCode, payload []byte) {
	w.buf = appendHeader(w.buf, op, len(payload))
	if len(payload) <= copyLimit {
		w.buf = append(w.buf, payload...)
		return
	}
	// Earlier iovecs keep pointing at buf's bytes even if a later append
	// moves buf: what they cover is never written again.
	w.iov = append(w.iov, w.buf[w.mark:], payload)
	w.mark = len(w.buf)
}

// appendHeader appends a final, unmasked frame's header.
func appendHeader(b []byte, op ws.OpCode, n int) []byte {
	b = append(b, 0x80|byte(op))
	switch {
	case n < 126:
		return append(b, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 126), uint16(n))
	default:
		return binary.BigEndian.AppendUint64(append(b, 127), uint64(n))
	}
}

// writeTo writes the batch: one write(2), or one writev(2) on a TCP
// connection when payloads were left in place.
func (w *frameBuffer) writeTo(c io.Writer) error {
	if len(w.iov) == 0 {
		_, err := c.Write(w.buf)
		return err
	}
	if w.mark < len(w.buf) {
		w.iov = append(w.iov, w.buf[w.mark:])
	}
	iov := w.iov // WriteTo consumes the slice it is given
	_, err := iov.WriteTo(c)
	return err
}
