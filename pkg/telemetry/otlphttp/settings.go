package otlphttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Headers is OTEL_EXPORTER_OTLP_HEADERS as the OpenTelemetry specification
// writes it: key=value pairs separated by commas, the values
// percent-encoded. Its errors name the pair by position, never its value,
// which is often a credential.
type Headers map[string]string

// EnvDecode implements pkg/config's Decoder.
func (h *Headers) EnvDecode(v string) error {
	out := Headers{}
	for i, pair := range strings.Split(v, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || !validName(k) {
			return fmt.Errorf("header %d is not name=value with a valid header name", i+1)
		}
		val, err := url.PathUnescape(strings.TrimSpace(val))
		if err != nil || !validValue(val) {
			return fmt.Errorf("header %d (%s): the value is not a valid percent-encoded header value", i+1, k)
		}
		out[http.CanonicalHeaderKey(k)] = val
	}
	*h = out
	return nil
}

// TimeoutMillis is OTEL_EXPORTER_OTLP_TIMEOUT: whole milliseconds.
type TimeoutMillis time.Duration

// EnvDecode implements pkg/config's Decoder.
func (t *TimeoutMillis) EnvDecode(v string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 || n > int64(time.Hour/time.Millisecond) {
		return fmt.Errorf("%q is not a number of milliseconds between 1 and 3600000", v)
	}
	*t = TimeoutMillis(time.Duration(n) * time.Millisecond)
	return nil
}

// Compression is OTEL_EXPORTER_OTLP_COMPRESSION: gzip or none.
type Compression string

// EnvDecode implements pkg/config's Decoder.
func (c *Compression) EnvDecode(v string) error {
	switch v = strings.ToLower(strings.TrimSpace(v)); v {
	case "gzip", "none", "":
		*c = Compression(v)
		return nil
	}
	return errors.New("want gzip or none")
}

// Gzip reports whether bodies are compressed.
func (c Compression) Gzip() bool { return c == "gzip" }

// validName is an RFC 9110 token (golang.org/x/net/http/httpguts has it,
// at the price of linking idna's tables into the Lambda).
func validName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// validValue refuses what would end the header or smuggle another one.
func validValue(v string) bool {
	for _, r := range v {
		if (r < ' ' && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
}
