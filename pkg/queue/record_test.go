package queue

import (
	"bytes"
	"maps"
	"testing"
)

func sampleRecords() []*record {
	return []*record{
		{id: "id", body: []byte("x")},
		{id: "0d9c3c6e-5b4e-4f7a-9d55-3d3c8c9b2a10", body: []byte(`{"type":"task.status"}`),
			attrs:  map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "kind": "event"},
			sentAt: 1_700_000_000_000_000_000, visibleAt: 1_700_000_030_000_000_000, receives: 3, receipt: 0xfeedface},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		got, err := decodeRecord(r.encode())
		if err != nil {
			t.Fatal(err)
		}
		if !sameRecord(got, r) {
			t.Fatalf("decode(encode(%+v)) = %+v", r, got)
		}
	}
}

func sameRecord(a, b *record) bool {
	return a.id == b.id && bytes.Equal(a.body, b.body) && maps.Equal(a.attrs, b.attrs) &&
		a.sentAt == b.sentAt && a.visibleAt == b.visibleAt && a.receives == b.receives && a.receipt == b.receipt
}

// FuzzDecodeRecord feeds damaged file contents to the record decoder: it
// must never panic or over-allocate, and whatever it accepts must survive
// another round trip unchanged.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range sampleRecords() {
		f.Add(r.encode())
	}
	f.Add([]byte{recordVersion})
	f.Add([]byte{recordVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b)
		if err != nil {
			return
		}
		again, err := decodeRecord(r.encode())
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if !sameRecord(r, again) {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
	})
}

// FuzzDecodeReceipt feeds arbitrary receipt handles, which callers pass
// in, to the decoder: no panics, and an accepted handle is canonical.
func FuzzDecodeReceipt(f *testing.F) {
	f.Add(encodeReceipt(1, 2))
	f.Add(encodeReceipt(^uint64(0), 1))
	f.Add("")
	f.Add("not-a-receipt-handle")
	f.Add("AAAAAAAAAAEAAAAAAAAAAA=")
	f.Fuzz(func(t *testing.T, h string) {
		seq, receipt, err := decodeReceipt(h)
		if err != nil {
			return
		}
		if receipt == 0 {
			t.Fatal("accepted a handle without a receipt")
		}
		if got := encodeReceipt(seq, receipt); got != h {
			t.Fatalf("accepted %q, which re-encodes as %q", h, got)
		}
	})
}
