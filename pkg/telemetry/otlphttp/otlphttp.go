// Package otlphttp exports traces and metrics over OTLP/HTTP in protobuf
// without linking gRPC. The OpenTelemetry SDK's otlptracehttp and
// otlpmetrichttp build their requests with the collector packages of
// go.opentelemetry.io/proto/otlp, which also hold the gRPC service stubs and
// grpc-gateway handlers, so a program that only posts protobuf links gRPC and
// grpc-gateway, and pays their package initialization on every start. The
// Librarian Lambda is such a program. An export request is only
// `repeated ResourceSpans resource_spans = 1` (ResourceMetrics for metrics),
// so this package marshals each item with the proto/otlp message packages
// and writes the field tags itself with protowire.
//
// It keeps the SDK exporters' behaviour where it matters: the same request
// headers, gzip on demand, one deadline per attempt, retries of 429, 502, 503
// and 504 (and of temporary network errors) with the SDK's exponential
// backoff, waiting at least as long as Retry-After asks, for at most a
// minute, and a bound on the request's size. It reads no environment: the
// caller passes the settings. It parses nothing of the collector's answer
// but its status and Retry-After: the body of a success (a partial success
// report) is discarded unread, that of a failure quoted, truncated, in the
// error.
package otlphttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Defaults are the SDK exporters' (OTEL_EXPORTER_OTLP_TIMEOUT's default, and
// otlptracehttp's request size bound).
const (
	DefaultTimeout        = 10 * time.Second
	DefaultMaxRequestSize = 64 << 20
)

// Config is where and how to send. Headers hold secrets (an API key, a
// bearer token): nothing here writes them to an error or a log.
type Config struct {
	// Endpoint is the collector's base URL, such as http://localhost:4318;
	// the signal's path (/v1/traces, /v1/metrics) is appended.
	Endpoint string
	// Headers are set on every request (OTEL_EXPORTER_OTLP_HEADERS).
	Headers map[string]string
	// Gzip compresses request bodies (OTEL_EXPORTER_OTLP_COMPRESSION=gzip).
	Gzip bool
	// Timeout bounds each attempt to send an export, as the SDK's HTTP
	// client does; zero means DefaultTimeout (OTEL_EXPORTER_OTLP_TIMEOUT).
	Timeout time.Duration
	// MaxRequestSize refuses an export whose encoded request (before
	// compression) is larger; zero means DefaultMaxRequestSize.
	MaxRequestSize int
	// Client sends the requests; nil means a client of its own.
	Client *http.Client
	// Retry is the backoff between attempts; the zero value is the SDK's.
	Retry Retry
}

// Retry is an exponential backoff: the first wait about Initial, each next
// one Multiplier (1.5) times longer up to Max, each randomized by ±50%, and
// no attempt started after MaxElapsed. A Retry-After longer than the wait is
// waited instead. The zero value is the SDK exporters' default (5 s, 30 s,
// one minute).
type Retry struct {
	Initial, Max, MaxElapsed time.Duration
	// Disabled sends each export once.
	Disabled bool
}

func (r Retry) withDefaults() Retry {
	if r.Initial <= 0 {
		r.Initial = 5 * time.Second
	}
	if r.Max <= 0 {
		r.Max = 30 * time.Second
	}
	if r.MaxElapsed <= 0 {
		r.MaxElapsed = time.Minute
	}
	return r
}

// sender posts encoded export requests to one signal's URL.
type sender struct {
	url, redacted string
	headers       http.Header
	gzip          bool
	timeout       time.Duration
	maxSize       int
	client        *http.Client
	retry         Retry
	// life ends at Shutdown, which interrupts exports in flight.
	life context.Context
	end  context.CancelFunc
}

func newSender(cfg Config, path string) (*sender, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The endpoint may carry credentials: do not quote it.
		return nil, errors.New("otlphttp: the endpoint is not an http or https URL with a host")
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	s := &sender{url: u.String(), redacted: u.Redacted(), headers: http.Header{}, gzip: cfg.Gzip, timeout: cfg.Timeout,
		maxSize: cfg.MaxRequestSize, client: cfg.Client, retry: cfg.Retry.withDefaults()}
	for k, v := range cfg.Headers {
		s.headers.Set(k, v)
	}
	s.headers.Set("Content-Type", "application/x-protobuf")
	s.headers.Set("User-Agent", "conclave-otlphttp")
	if s.gzip {
		s.headers.Set("Content-Encoding", "gzip")
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.maxSize <= 0 {
		s.maxSize = DefaultMaxRequestSize
	}
	if s.client == nil {
		s.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	s.life, s.end = context.WithCancel(context.Background())
	return s, nil
}

// encode is the export request: each item as field 1, length-delimited,
// which is what ExportTraceServiceRequest and ExportMetricsServiceRequest
// are.
func encode[M proto.Message](items []M) ([]byte, error) {
	var b []byte
	for _, m := range items {
		size := proto.Size(m)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(size))
		var err error
		if b, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, m); err != nil {
			return nil, fmt.Errorf("otlphttp: encode: %w", err)
		}
	}
	return b, nil
}

// send posts body, retrying what the SDK retries, within the export's
// context and until Shutdown.
func (s *sender) send(ctx context.Context, body []byte) error {
	if len(body) > s.maxSize {
		return fmt.Errorf("otlphttp: request of %d bytes is larger than the limit of %d", len(body), s.maxSize)
	}
	if s.life.Err() != nil {
		return errors.New("otlphttp: exporter shut down")
	}
	if s.gzip {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(body); err != nil {
			return fmt.Errorf("otlphttp: gzip: %w", err)
		}
		if err := zw.Close(); err != nil {
			return fmt.Errorf("otlphttp: gzip: %w", err)
		}
		body = buf.Bytes()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	start := time.Now()
	wait := s.retry.Initial
	for {
		retryAfter, err := s.post(ctx, body)
		if err == nil {
			return nil
		}
		var r retryable
		if s.retry.Disabled || !errors.As(err, &r) {
			return err
		}
		delay := max(retryAfter, jitter(wait))
		if time.Since(start)+delay > s.retry.MaxElapsed {
			return fmt.Errorf("otlphttp: giving up after %s: %w", time.Since(start).Round(time.Millisecond), err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("otlphttp: %w while waiting to retry: %w", context.Cause(ctx), err)
		case <-t.C:
		}
		wait = min(time.Duration(float64(wait)*1.5), s.retry.Max)
	}
}

// jitter randomizes d by ±50%, as the SDK's backoff does, so that many
// exporters refused at once do not retry at once.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.5 + rand.Float64())) //nolint:gosec // not a secret
}

// retryable marks a failure worth another attempt.
type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

// errBodyQuote bounds how much of a refusal's body an error quotes.
const errBodyQuote = 512

// post makes one attempt; it returns the wait Retry-After asks for.
func (s *sender) post(ctx context.Context, body []byte) (time.Duration, error) {
	attempt, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(attempt, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("otlphttp: %w", err)
	}
	req.Header = s.headers.Clone()
	resp, err := s.client.Do(req)
	if err != nil {
		// The client's errors name the URL without its password, never
		// the headers. Only a temporary failure is retried, as the SDK
		// does: a collector that refuses connections fails the export at
		// once instead of holding a Lambda's flush for a minute.
		err = fmt.Errorf("otlphttp: %w", err)
		if ue := (*url.Error)(nil); errors.As(err, &ue) && ue.Temporary() && ctx.Err() == nil {
			return 0, retryable{err}
		}
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		// A partial success report is not read: draining a bounded amount
		// keeps the connection for the next export.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, nil
	}
	quote, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyQuote))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	err = fmt.Errorf("otlphttp: %s answered %s: %s", s.redacted, resp.Status, printable(quote))
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return retryAfter(resp.Header.Get("Retry-After"), time.Now()), retryable{err}
	}
	return 0, err
}

// retryAfter reads Retry-After: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(min(n, int64(time.Duration(1<<63-1)/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// printable is a quoted body safe to put in a log line.
func printable(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "(empty body)"
	}
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes, not text)", len(b))
	}
	return strconv.Quote(string(b))
}

func (s *sender) shutdown() { s.end() }
