// Package backend is the console's side of the other services' public
// APIs: the gateway's REST client API, the bus's WebSocket JSON-RPC and its
// dead-letter API, the runner's REST API and the Librarian's API. Each call
// takes the caller's bearer token (from their session); none is kept here.
package backend

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Kind says what went wrong with a call, for the page to say it plainly.
type Kind int

const (
	// Unavailable: the service could not be reached, or answered 5xx.
	Unavailable Kind = iota
	// Unauthorized: the service refused the token (401 or 403).
	Unauthorized
	// Rejected: the service refused the request itself (4xx).
	Rejected
)

// Error is a failed call to a service.
type Error struct {
	Service string // "gateway", "bus", "runner", "librarian"
	Kind    Kind
	Status  int // HTTP status, 0 when there was no answer
	Message string
	Err     error
}

func (e *Error) Error() string {
	switch {
	case e.Status == 0:
		return fmt.Sprintf("the %s cannot be reached: %s", e.Service, e.Message)
	case e.Kind == Unauthorized:
		return fmt.Sprintf("the %s refused the token (%d): %s", e.Service, e.Status, e.Message)
	default:
		return fmt.Sprintf("the %s answered %d: %s", e.Service, e.Status, e.Message)
	}
}

func (e *Error) Unwrap() error { return e.Err }

// IsUnavailable reports whether err is a service that could not answer,
// which the console shows as a banner on that service's panel.
func IsUnavailable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == Unavailable
}

// IsKind reports whether err is a service error of kind k.
func IsKind(err error, k Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == k
}

// StatusOf is the HTTP status a service answered, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// Observer counts calls by service and outcome (metrics).
type Observer func(service, outcome string)

// Client calls one service's HTTP API.
type Client struct {
	Service string
	// Base is the service's URL, e.g. http://127.0.0.1:8080; a func so
	// that conclave dev can hand over addresses bound after the console
	// was built.
	Base func() string
	HTTP *http.Client
	// Timeout bounds each unary call; streams are bounded by their context.
	Timeout time.Duration
	Observe Observer
}

// maxResponseBytes bounds a unary answer.
const maxResponseBytes = 8 << 20

func (c *Client) observe(outcome string) {
	if c.Observe != nil {
		c.Observe(c.Service, outcome)
	}
}

// request builds a request with the token and trace context.
func (c *Client) request(ctx context.Context, token, method, path string, body any) (*http.Request, error) {
	base := strings.TrimSuffix(c.Base(), "/")
	if base == "" {
		return nil, &Error{Service: c.Service, Kind: Unavailable, Message: "its address is not known yet"}
	}
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s request body: %w", c.Service, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, &Error{Service: c.Service, Kind: Unavailable, Message: "bad address " + base, Err: err}
	}
	if body != nil || method != http.MethodGet {
		// Even without a body: the services refuse a POST that does not
		// declare JSON when it has no token to show (httpguard.ContentType).
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req, nil
}

// send performs req and turns failures into *Error. On success the caller
// owns the body.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		c.observe("unavailable")
		return nil, &Error{Service: c.Service, Kind: Unavailable, Message: cleanNetError(err), Err: err}
	}
	if resp.StatusCode/100 == 2 {
		c.observe("ok")
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{Service: c.Service, Status: resp.StatusCode, Message: errorMessage(data, resp.Status)}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		e.Kind = Unauthorized
		c.observe("unauthorized")
	case resp.StatusCode >= 500:
		e.Kind = Unavailable
		c.observe("unavailable")
	default:
		e.Kind = Rejected
		c.observe("rejected")
	}
	return nil, e
}

// cleanNetError drops the request line Go puts in front of a transport
// error ("Get \"http://...\": dial tcp ...") down to its cause.
func cleanNetError(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, "\": "); i >= 0 {
		msg = msg[i+3:]
	}
	return msg
}

// errorMessage finds the message in the services' error bodies:
// grpc-gateway's {"code","message"}, the runner's {"error","message"}, the
// Librarian's and pkg/server's {"error":{"message"}}.
func errorMessage(body []byte, status string) string {
	var flat struct {
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &flat) == nil {
		if flat.Message != "" {
			return flat.Message
		}
		var nested struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(flat.Error, &nested) == nil && nested.Message != "" {
			return nested.Message
		}
		var s string
		if json.Unmarshal(flat.Error, &s) == nil && s != "" {
			return s
		}
	}
	if t := strings.TrimSpace(string(body)); t != "" && len(t) < 300 {
		return t
	}
	return status
}

// Do sends a unary JSON call and decodes the answer into out (when non-nil).
func (c *Client) Do(ctx context.Context, token, method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := c.request(ctx, token, method, path, body)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return &Error{Service: c.Service, Kind: Unavailable, Status: resp.StatusCode, Message: "reading the answer: " + err.Error(), Err: err}
	}
	if out == nil {
		return nil
	}
	if err := decode(data, out); err != nil {
		return &Error{Service: c.Service, Kind: Unavailable, Status: resp.StatusCode, Message: "the answer is not what the console expects: " + err.Error(), Err: err}
	}
	return nil
}

// Stream sends a call whose answer is a stream and returns the open body.
func (c *Client) Stream(ctx context.Context, token, method, path, accept string, body any) (io.ReadCloser, error) {
	req, err := c.request(ctx, token, method, path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WithTrace returns ctx carrying a span context, and its trace id: the
// request's own span when tracing is on, otherwise a fresh random trace
// that the outgoing calls carry in their traceparent, so that every
// request, message and instance the console starts has a trace id to show
// (and to find in Jaeger, when the services trace).
func WithTrace(ctx context.Context) (context.Context, string) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return ctx, sc.TraceID().String()
	}
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = rand.Read(tid[:])
	_, _ = rand.Read(sid[:])
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(ctx, sc), tid.String()
}
