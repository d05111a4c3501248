package history

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestKeysAsFmtWouldPrintThem: the keys are built by hand for speed; their
// form is the one the layout documents, which fmt states plainly.
func TestKeysAsFmtWouldPrintThem(t *testing.T) {
	for _, tc := range []struct {
		ms  int64
		req string
		seq uint32
	}{
		{0, "r", 0},
		{1767225600000, "gw-1.0123456789abcdef01234567", 7},
		{9999999999999, "x", math.MaxUint32},
		{12345678901234, "longer-than-13-digits", 0xabc},
		{1, strings.Repeat("r", 120), 1}, // longer than the stack buffer
	} {
		k := entryKey{ms: tc.ms, requestID: tc.req, seq: tc.seq}
		if got, want := k.String(), fmt.Sprintf("%013d.%s/%08x", tc.ms, tc.req, tc.seq); got != want {
			t.Errorf("entryKey%+v.String() = %q, want %q", tc, got, want)
		}
		if got, want := entrySK(k), fmt.Sprintf("e/%013d.%s/%08x", tc.ms, tc.req, tc.seq); got != want {
			t.Errorf("entrySK(%+v) = %q, want %q", tc, got, want)
		}
		if got, want := requestPrefix(tc.ms, tc.req), fmt.Sprintf("%013d.%s/", tc.ms, tc.req); got != want {
			t.Errorf("requestPrefix(%d, %q) = %q, want %q", tc.ms, tc.req, got, want)
		}
		if got, want := indexSK(tc.ms, tc.req), fmt.Sprintf("%013d/%s", tc.ms, tc.req); got != want {
			t.Errorf("indexSK(%d, %q) = %q, want %q", tc.ms, tc.req, got, want)
		}
	}
}
