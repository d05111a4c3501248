package wsconn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/gobwas/ws"
)

// clientFrame is one frame as a client sends it, masked unless unmasked.
type clientFrame struct {
	fin      bool
	rsv      byte
	op       byte
	payload  []byte
	unmasked bool
	// length, when set, is the length the header declares instead of the
	// payload's.
	length uint64
}

func (f clientFrame) bytes() []byte {
	b0 := f.op | f.rsv<<4
	if f.fin {
		b0 |= 0x80
	}
	n := uint64(len(f.payload))
	if f.length != 0 {
		n = f.length
	}
	var mask byte = 0x80
	if f.unmasked {
		mask = 0
	}
	out := []byte{b0}
	switch {
	case n < 126:
		out = append(out, mask|byte(n))
	case n <= 0xffff:
		out = binary.BigEndian.AppendUint16(append(out, mask|126), uint16(n))
	default:
		out = binary.BigEndian.AppendUint64(append(out, mask|127), n)
	}
	p := bytes.Clone(f.payload)
	if !f.unmasked {
		key := [4]byte{0x37, 0xfa, 0x21, 0x3d}
		out = append(out, key[:]...)
		ws.Cipher(p, key, 0)
	}
	return append(out, p...)
}

func text(s string) clientFrame { return clientFrame{fin: true, op: 0x1, payload: []byte(s)} }

func stream(frames ...clientFrame) []byte {
	var b []byte
	for _, f := range frames {
		b = append(b, f.bytes()...)
	}
	return b
}

// readAll reads frames until an error, recording what came.
func readAll(input []byte, max int) (got []string, err error) {
	r := reader{br: bufio.NewReaderSize(bytes.NewReader(input), readBufferSize), max: max}
	for {
		kind, p, err := r.next()
		if err != nil {
			return got, err
		}
		got = append(got, [...]string{"msg", "ping", "pong", "close"}[kind]+":"+string(p))
	}
}

func TestReaderFrames(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("b", 70000) // a 64-bit length, over trustedPrealloc
	mid := strings.Repeat("m", 300)   // a 16-bit length, over the read buffer
	tests := []struct {
		name   string
		input  []byte
		want   []string
		status ws.StatusCode // of the protocolError that ends the read; 0 for io.EOF
	}{
		{name: "text", input: stream(text(`{"a":1}`)), want: []string{`msg:{"a":1}`}},
		{name: "binary", input: stream(clientFrame{fin: true, op: 0x2, payload: []byte{0xff, 0}}), want: []string{"msg:\xff\x00"}},
		{name: "empty", input: stream(text("")), want: []string{"msg:"}},
		{name: "lengths", input: stream(text(mid), text(big)), want: []string{"msg:" + mid, "msg:" + big}},
		{name: "fragments with control frames between", input: stream(
			clientFrame{op: 0x1, payload: []byte("he")},
			clientFrame{fin: true, op: 0x9, payload: []byte("p1")},
			clientFrame{op: 0x0, payload: []byte("ll")},
			clientFrame{fin: true, op: 0xa, payload: []byte("p2")},
			clientFrame{fin: true, op: 0x0, payload: []byte("o")},
			text("next")),
			want: []string{"ping:p1", "pong:p2", "msg:hello", "msg:next"}},
		{name: "utf-8 split across fragments", input: stream(
			clientFrame{op: 0x1, payload: []byte("\xe2\x82")}, clientFrame{fin: true, op: 0x0, payload: []byte("\xac")}),
			want: []string{"msg:€"}},
		{name: "close", input: stream(clientFrame{fin: true, op: 0x8, payload: []byte("\x03\xe8bye")}), want: []string{"close:\x03\xe8bye"}},
		{name: "unmasked", input: stream(clientFrame{fin: true, op: 0x1, payload: []byte("x"), unmasked: true}), status: ws.StatusProtocolError},
		{name: "reserved bits", input: stream(clientFrame{fin: true, rsv: 4, op: 0x1, payload: []byte("x")}), status: ws.StatusProtocolError},
		{name: "reserved data opcode", input: stream(clientFrame{fin: true, op: 0x3}), status: ws.StatusProtocolError},
		{name: "reserved control opcode", input: stream(clientFrame{fin: true, op: 0xb}), status: ws.StatusProtocolError},
		{name: "control frame over 125 bytes", input: stream(clientFrame{fin: true, op: 0x9, payload: bytes.Repeat([]byte("p"), 126)}), status: ws.StatusProtocolError},
		{name: "fragmented control frame", input: stream(clientFrame{op: 0x9, payload: []byte("p")}), status: ws.StatusProtocolError},
		{name: "continuation without a start", input: stream(clientFrame{fin: true, op: 0x0, payload: []byte("x")}), status: ws.StatusProtocolError},
		{name: "new message inside a fragmented one", input: stream(clientFrame{op: 0x1, payload: []byte("a")}, text("b")), status: ws.StatusProtocolError},
		{name: "64-bit length with its top bit set", input: stream(clientFrame{fin: true, op: 0x1, length: 1 << 63}), status: ws.StatusProtocolError},
		{name: "message over the limit", input: stream(text(strings.Repeat("x", 1025))), status: ws.StatusMessageTooBig},
		{name: "declared length over the limit, nothing sent", input: stream(clientFrame{fin: true, op: 0x1, length: 1 << 40}), status: ws.StatusMessageTooBig},
		{name: "fragments over the limit together", input: stream(
			clientFrame{op: 0x1, payload: bytes.Repeat([]byte("x"), 600)}, clientFrame{fin: true, op: 0x0, payload: bytes.Repeat([]byte("x"), 600)}),
			status: ws.StatusMessageTooBig},
		{name: "text that is not utf-8", input: stream(text("\xff")), status: ws.StatusInvalidFramePayloadData},
		{name: "message at the limit", input: stream(text(strings.Repeat("x", 1024))), want: []string{"msg:" + strings.Repeat("x", 1024)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			max := 1024
			if tt.name == "lengths" {
				max = 1 << 20
			}
			got, err := readAll(tt.input, max)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("read %q, want %q", got, tt.want)
			}
			var perr *protocolError
			switch {
			case tt.status == 0 && err != io.EOF:
				t.Errorf("ended with %v, want io.EOF", err)
			case tt.status != 0 && (!errors.As(err, &perr) || perr.code != tt.status):
				t.Errorf("ended with %v, want a protocol error with close code %d", err, tt.status)
			}
		})
	}
}

// TestReaderTruncated: a connection that ends inside a frame is an
// unexpected EOF, not a clean end.
func TestReaderTruncated(t *testing.T) {
	t.Parallel()
	whole := stream(text(strings.Repeat("x", 300)), clientFrame{fin: true, op: 0x9, payload: []byte("ping")})
	for cut := 1; cut < len(whole); cut++ {
		if cut == len(text(strings.Repeat("x", 300)).bytes()) {
			continue // between the two frames: a clean end
		}
		_, err := readAll(whole[:cut], 1<<20)
		if err != io.ErrUnexpectedEOF {
			t.Fatalf("cut at %d of %d: %v, want io.ErrUnexpectedEOF", cut, len(whole), err)
		}
	}
}

func TestCloseFrameData(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		payload string
		code    ws.StatusCode
		reason  string
		status  ws.StatusCode // of the protocolError; 0 when valid
	}{
		{name: "no code", payload: "", code: ws.StatusNoStatusRcvd},
		{name: "code and reason", payload: "\x03\xe9bye", code: ws.StatusGoingAway, reason: "bye"},
		{name: "application code", payload: "\x0f\xa0", code: 4000},
		{name: "one byte", payload: "\x03", status: ws.StatusProtocolError},
		{name: "code below 1000", payload: "\x03\xe7", status: ws.StatusProtocolError},
		{name: "1005 is never sent", payload: "\x03\xed", status: ws.StatusProtocolError},
		{name: "1006 is never sent", payload: "\x03\xee", status: ws.StatusProtocolError},
		{name: "unassigned 1016", payload: "\x03\xf8", status: ws.StatusProtocolError},
		{name: "reason not utf-8", payload: "\x03\xe8\xff", status: ws.StatusInvalidFramePayloadData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, reason, err := closeFrameData([]byte(tt.payload))
			var perr *protocolError
			if tt.status != 0 {
				if !errors.As(err, &perr) || perr.code != tt.status {
					t.Errorf("got %v, want a protocol error with close code %d", err, tt.status)
				}
				return
			}
			if err != nil || code != tt.code || reason != tt.reason {
				t.Errorf("got %d %q %v, want %d %q", code, reason, err, tt.code, tt.reason)
			}
		})
	}
}

// TestClosePayloadFitsAControlFrame: a long reason is cut at a character
// boundary so that the close frame stays within 125 bytes.
func TestClosePayloadFitsAControlFrame(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{"", "short", strings.Repeat("é", 100), strings.Repeat("x", 200)} {
		p := closePayload(ws.StatusPolicyViolation, reason)
		code, got, err := closeFrameData(p)
		if len(p) > ws.MaxControlFramePayloadSize || err != nil || code != ws.StatusPolicyViolation || !strings.HasPrefix(reason, got) {
			t.Errorf("reason %.10q...: payload of %d bytes, parsed %d %.10q %v", reason, len(p), code, got, err)
		}
	}
	if p := closePayload(ws.StatusNoStatusRcvd, "x"); len(p) != 0 {
		t.Errorf("1005 sent as %q, want an empty close frame", p)
	}
}

// FuzzReader: whatever a client sends, the reader returns messages within
// the limit or ends with an error; it never panics or over-allocates.
func FuzzReader(f *testing.F) {
	f.Add(stream(text(`{"jsonrpc":"2.0","method":"ping","id":1}`)))
	f.Add(stream(clientFrame{op: 0x1, payload: []byte("a")}, clientFrame{fin: true, op: 0x9, payload: []byte("p")}, clientFrame{fin: true, op: 0x0, payload: []byte("b")}))
	f.Add(stream(clientFrame{fin: true, op: 0x8, payload: []byte("\x03\xe8")}))
	f.Add(stream(text(strings.Repeat("x", 300))))
	f.Add(stream(clientFrame{fin: true, op: 0x1, length: 1 << 40}))
	const max = 4096
	f.Fuzz(func(t *testing.T, input []byte) {
		r := reader{br: bufio.NewReaderSize(bytes.NewReader(input), readBufferSize), max: max}
		for {
			kind, p, err := r.next()
			if err != nil {
				var perr *protocolError
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.As(err, &perr) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(p) > max || kind != kindMessage && len(p) > ws.MaxControlFramePayloadSize {
				t.Fatalf("kind %d with %d bytes", kind, len(p))
			}
			if kind == kindClose {
				_, _, _ = closeFrameData(p)
			}
		}
	})
}
