package store

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

// FuzzDecodeRecord feeds arbitrary bytes to the embedded backend's record
// decoder, which reads a file that may be damaged: it must fail cleanly,
// never panic, and re-encode what it accepts to the same bytes' meaning.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(Item{Version: 3, Counter: -2, Data: []byte("d"), Attrs: map[string]string{"a": "b"}, ExpiresAt: time.UnixMilli(1700000000000)}))
	f.Add(encodeRecord(Item{}))
	f.Add([]byte{recordVersion, 0xff, 0xff, 0xff})
	f.Add([]byte{recordVersion, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		k := Key{PK: "p", SK: "s"}
		it, err := decodeRecord(k, b)
		if err != nil {
			return
		}
		again, err := decodeRecord(k, encodeRecord(it))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if again.Version != it.Version || again.Counter != it.Counter || !bytes.Equal(again.Data, it.Data) ||
			!again.ExpiresAt.Equal(it.ExpiresAt) || len(again.Attrs) != len(it.Attrs) {
			t.Fatalf("round trip changed the item: %+v vs %+v", it, again)
		}
	})
}

// FuzzDecodeCursor feeds arbitrary cursors, which come back from API clients.
func FuzzDecodeCursor(f *testing.F) {
	f.Add(encodeCursor("p", "s"), "p")
	f.Add(encodeCursor("q", "s"), "p")
	f.Add("", "p")
	f.Add("!!!", "p")
	f.Add("e30", "p")
	f.Fuzz(func(t *testing.T, c, pk string) {
		sk, err := decodeCursor(c, pk)
		if err != nil || c == "" {
			return
		}
		if sk == "" {
			t.Fatal("accepted a cursor without a sort key")
		}
		if back, err := decodeCursor(encodeCursor(pk, sk), pk); err != nil || back != sk {
			t.Fatalf("round trip: %q, %v", back, err)
		}
	})
}

func FuzzSplitBoltKey(f *testing.F) {
	f.Add(boltKey("p", "s"))
	f.Add([]byte{0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := splitBoltKey(b)
		if err != nil {
			return
		}
		if !bytes.Equal(boltKey(k.PK, k.SK), b) {
			t.Fatalf("key %x splits to %+v which does not rebuild it", b, k)
		}
	})
}

// validAttrName must accept exactly what the counted form of its pattern
// matched.
func FuzzValidAttrName(f *testing.F) {
	counted := regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`)
	for _, s := range []string{"", "a", "subject", "a_1", "_a", "1a", "a-b", "é", "a\n", strings.Repeat("a", 64), strings.Repeat("a", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := validAttrName(name), counted.MatchString(name); got != want {
			t.Fatalf("validAttrName(%q) = %v, the counted pattern says %v", name, got, want)
		}
	})
}
