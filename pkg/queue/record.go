package queue

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// record is a message as the embedded backend stores it. The encoding is a
// small fixed binary layout rather than JSON or gob because every receive
// rewrites the record, and bodies would otherwise be base64-inflated.
type record struct {
	id    string
	body  []byte
	attrs map[string]string
	// sentAt and visibleAt are Unix nanoseconds.
	sentAt    int64
	visibleAt int64
	receives  uint32
	// receipt identifies the current receive; 0 before the first. A
	// receipt handle is only honoured while it matches, which makes handles
	// from earlier receives stale, as in SQS.
	receipt uint64
}

const recordVersion = 1

var errCorrupt = errors.New("corrupt record")

// encode lays the record out as: version byte, sentAt, visibleAt, receipt
// (8 bytes big-endian each), then uvarints for receives, the lengths of id
// and body, and the attribute count, each length followed by its bytes.
func (r *record) encode() []byte {
	n := 1 + 3*8 + 5*binary.MaxVarintLen32 + len(r.id) + len(r.body)
	for k, v := range r.attrs {
		n += 2*binary.MaxVarintLen32 + len(k) + len(v)
	}
	b := make([]byte, 0, n)
	b = append(b, recordVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(r.sentAt))
	b = binary.BigEndian.AppendUint64(b, uint64(r.visibleAt))
	b = binary.BigEndian.AppendUint64(b, r.receipt)
	b = binary.AppendUvarint(b, uint64(r.receives))
	b = appendBytes(b, []byte(r.id))
	b = appendBytes(b, r.body)
	b = binary.AppendUvarint(b, uint64(len(r.attrs)))
	for k, v := range r.attrs {
		b = appendBytes(b, []byte(k))
		b = appendBytes(b, []byte(v))
	}
	return b
}

func appendBytes(b, p []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(p))), p...)
}

// decodeRecord parses encode's output. The file may be damaged, so every
// length is checked against what is left and nothing is trusted.
func decodeRecord(b []byte) (*record, error) {
	d := decoder{b: b}
	if v := d.byte(); v != recordVersion {
		return nil, fmt.Errorf("%w: version %d", errCorrupt, v)
	}
	r := &record{
		sentAt:    int64(d.uint64()),
		visibleAt: int64(d.uint64()),
		receipt:   d.uint64(),
	}
	receives := d.uvarint()
	if receives > math.MaxUint32 {
		d.fail()
	}
	r.receives = uint32(receives)
	r.id = string(d.bytes())
	r.body = d.bytes()
	if n := d.uvarint(); n > 0 {
		// Each attribute takes at least two bytes, which bounds the map.
		if n > uint64(len(d.b))/2 {
			d.fail()
		} else {
			r.attrs = make(map[string]string, n)
			for range n {
				k := string(d.bytes())
				r.attrs[k] = string(d.bytes())
			}
		}
	}
	if d.err == nil && len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return r, nil
}

// decoder reads from b and remembers the first error, so decodeRecord can
// read straight through and check once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or out of range", errCorrupt)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uint64() uint64 {
	if len(d.b) < 8 {
		d.fail()
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	// A copy, because bbolt's memory is only valid inside the transaction.
	v := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return v
}

// A receipt handle is the message's sequence number in its queue and the
// receipt of that receive, base64url-encoded. Handles come back from
// callers, so decoding them is as careful as decoding records.
const receiptLen = 16

func encodeReceipt(seq, receipt uint64) string {
	var b [receiptLen]byte
	binary.BigEndian.PutUint64(b[:8], seq)
	binary.BigEndian.PutUint64(b[8:], receipt)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func decodeReceipt(h string) (seq, receipt uint64, err error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(h)
	if err != nil || len(b) != receiptLen {
		return 0, 0, fmt.Errorf("%w: %q is not a handle of the embedded backend", ErrInvalidReceipt, h)
	}
	seq, receipt = binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	if receipt == 0 {
		return 0, 0, fmt.Errorf("%w: %q has no receipt", ErrInvalidReceipt, h)
	}
	return seq, receipt, nil
}
