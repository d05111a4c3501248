package history

import (
	"encoding/hex"
	"errors"
	"testing"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// FuzzParseEntryID: entry ids and page tokens come back from clients. A
// parse either fails or yields the key that prints as the same id, so no
// two ids name one entry and none reaches the store malformed.
func FuzzParseEntryID(f *testing.F) {
	f.Add("0001767225600000.gw-1.00aa/00000000")
	f.Add(entryKey{ms: 1767225600000, requestID: "gw-1.0123456789abcdef01234567", seq: 7}.String())
	f.Add("0000000000000.a/b/0000000f")
	f.Add("0000000000000./00000000")
	f.Add("-000000000001.x/00000000")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseEntryID(s)
		if err != nil {
			return
		}
		if k.String() != s {
			t.Fatalf("%q parses to %+v, which prints as %q", s, k, k.String())
		}
		if _, part, err := itemKey(entryPrefix + s); err != nil || part != 0 {
			t.Fatalf("%q is an entry id but not an item key: %d %v", s, part, err)
		}
	})
}

// FuzzDecodeEntries: items are read back from a file or a table that may
// hold anything; decoding fails cleanly or yields entries that encode back.
func FuzzDecodeEntries(f *testing.F) {
	f.Add(appendEntry(nil, &gatewayv1.ThreadEntry{Entry: &gatewayv1.ThreadEntry_Message{Message: &gatewayv1.ClientMessage{Content: "hi"}}}))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := decodeEntries(b)
		if err != nil {
			return
		}
		for _, e := range es {
			_ = appendEntry(nil, e)
		}
	})
}

// FuzzParseThreadsToken: ListThreads page tokens come back from clients. A
// token is refused, or names an index key that indexSK makes, so that it
// only ever bounds the agent's index where a real key could.
func FuzzParseThreadsToken(f *testing.F) {
	f.Add(hex.EncodeToString([]byte(indexSK(1767225600000, "thread-0123"))))
	f.Add(hex.EncodeToString([]byte("+000000000001/t")))
	f.Add(hex.EncodeToString([]byte("-000000000001/t")))
	f.Add("zz")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		sk, err := parseThreadsToken(token)
		if err != nil {
			if !errors.Is(err, ErrBadCursor) {
				t.Fatalf("%q: %v, want ErrBadCursor", token, err)
			}
			return
		}
		ms, thread, ok := parseIndexSK(sk)
		if !ok || indexSK(ms, thread) != sk || ms < 0 {
			t.Fatalf("%q names %q, which indexSK would not make (%d, %q)", token, sk, ms, thread)
		}
	})
}
