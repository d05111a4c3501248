package otlphttp

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0}, {"0", 0}, {"7", 7 * time.Second}, {"-3", 0}, {"soon", 0},
		{"99999999999999999999", 0}, // not an int64: not a date either
		{"9223372036", 9223372036 * time.Second},
		{"92233720368547758", time.Duration(1<<63-1) / time.Second * time.Second},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
	} {
		if got := retryAfter(tt.v, now); got != tt.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tt.v, got, tt.want)
		}
	}
}

// FuzzHeaders: whatever OTEL_EXPORTER_OTLP_HEADERS holds, decoding it
// never panics, yields only names and values net/http sends as they are,
// and an error never quotes a value.
func FuzzHeaders(f *testing.F) {
	for _, s := range []string{"a=b", "authorization=Bearer%20x,x-y=z", "=v", "k=%zz", "k=a%0d%0ab: c", " k = v ,, ", "k=v=w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var h Headers
		err := h.EnvDecode(s)
		if err != nil {
			for _, pair := range strings.Split(s, ",") {
				if _, v, ok := strings.Cut(pair, "="); ok && len(v) >= 8 && strings.Contains(err.Error(), v) {
					t.Fatalf("error %q quotes the value %q", err, v)
				}
			}
			return
		}
		for k, v := range h {
			if !validName(k) || !validValue(v) || k != http.CanonicalHeaderKey(k) {
				t.Fatalf("decoded %q: %q", k, v)
			}
			if strings.ContainsAny(v, "\r\n\x00") {
				t.Fatalf("value %q of %q would split the header", v, k)
			}
		}
	})
}
