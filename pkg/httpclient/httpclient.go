// Package httpclient is the one JSON-over-HTTP client, of the command
// line and of pkg/govern's calls to the Librarian: a base URL, a bearer
// token, JSON request bodies, answers read up to a limit, a deadline on
// every call, and every service's JSON error shape (docs/architecture.md,
// "Error shapes") turned into one *Error.
package httpclient

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
)

// Defaults for a Client's zero fields.
const (
	DefaultTimeout     = 30 * time.Second
	DefaultMaxResponse = 16 << 20
)

// Client calls one service. The zero value of a field takes its default.
type Client struct {
	// Base is the service's URL without a trailing slash, e.g.
	// http://127.0.0.1:8082; paths are appended to it.
	Base string
	// Token, when set, is sent as "Authorization: Bearer <token>".
	Token string
	// Timeout bounds a call: the whole exchange for Do and JSON, until the
	// answer's headers for Stream.
	Timeout time.Duration
	// MaxResponse bounds the bytes of an answer Do reads; a longer answer
	// is an error rather than a truncated document.
	MaxResponse int64
	// HTTP sends the requests; nil is http.DefaultClient.
	HTTP *http.Client
}

// New is a client of the service at base (a trailing slash is dropped).
func New(base, token string) *Client {
	return &Client{Base: strings.TrimSuffix(base, "/"), Token: token}
}

// Error is a service's answer of status 400 or more.
type Error struct {
	Method, Path string
	StatusCode   int
	// Code is the service's word for the error when it gives one: the
	// runner's "error", the Librarian's "status", the gateway's gRPC code.
	Code    string
	Message string
	// Field is the request field at fault, when the service names it.
	Field string
	// Details is the runner's further explanation.
	Details string
	// Header is the answer's headers (a Retry-After, say).
	Header http.Header
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d", e.Method, e.Path, e.StatusCode)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	} else {
		b.WriteString(" " + http.StatusText(e.StatusCode))
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Field != "" {
		b.WriteString(" (field " + e.Field + ")")
	}
	if e.Details != "" {
		b.WriteString(" (" + e.Details + ")")
	}
	return b.String()
}

// Do sends a request and returns the answer's body. body is nil (no
// body), a []byte or json.RawMessage sent as it is, or a value sent as its
// JSON. An answer of status 400 or more is an *Error.
func (c *Client) Do(ctx context.Context, method, path string, body any) ([]byte, error) {
	return c.Send(ctx, Request{Method: method, Path: path, Body: body})
}

// Request is one call, with what Do's arguments do not say.
type Request struct {
	Method, Path string
	// Body is as Do's.
	Body any
	// Token, when set, is sent instead of the client's: for a client that
	// acts for several callers, each with a token of its own.
	Token string
	// Header is further headers, e.g. an Idempotency-Key.
	Header http.Header
}

// Send is Do with the whole of a Request.
func (c *Client) Send(ctx context.Context, r Request) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := c.read(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", r.Method, r.Path, err)
	}
	if resp.StatusCode >= 400 {
		e := decodeError(r.Method, r.Path, resp.StatusCode, data)
		e.Header = resp.Header
		return nil, e
	}
	return data, nil
}

// JSON is Do that decodes the answer into out.
func (c *Client) JSON(ctx context.Context, method, path string, body, out any) error {
	data, err := c.Do(ctx, method, path, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: the answer is not the JSON expected: %w", method, path, err)
	}
	return nil
}

// Stream sends a request and returns the answer's body to read as it
// comes, for answers that last (a log's --follow): the timeout bounds only
// the wait for its headers, and ctx the rest. The caller closes the body.
func (c *Client) Stream(ctx context.Context, method, path string, body any) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(c.timeout(), cancel)
	resp, err := c.send(ctx, Request{Method: method, Path: path, Body: body})
	if !timer.Stop() {
		cancel()
		if err == nil {
			resp.Body.Close()
		}
		return nil, fmt.Errorf("%s %s: no answer within %v", method, path, c.timeout())
	}
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer cancel()
		defer resp.Body.Close()
		data, err := c.read(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
		}
		e := decodeError(method, path, resp.StatusCode, data)
		e.Header = resp.Header
		return nil, e
	}
	return cancelOnClose{resp.Body, cancel}, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

func (c *Client) send(ctx context.Context, r Request) (*http.Response, error) {
	method, path := r.Method, r.Path
	var rd io.Reader
	switch b := r.Body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case json.RawMessage:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range r.Header {
		req.Header[http.CanonicalHeaderKey(k)] = v
	}
	if method != http.MethodGet && method != http.MethodHead {
		// Declared even without a body: the services refuse a
		// state-changing request that a web page could send without
		// asking first.
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if token := cmp.Or(r.Token, c.Token); token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err // *url.Error names the method and URL
	}
	return resp, nil
}

// ErrTooLarge is wrapped by the error of an answer past the client's
// MaxResponse.
var ErrTooLarge = errors.New("the answer is larger than the client's limit")

func (c *Client) read(r io.Reader) ([]byte, error) {
	limit := c.MaxResponse
	if limit <= 0 {
		limit = DefaultMaxResponse
	}
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)
	}
	return data, nil
}

// maxShownBody bounds how much of an answer that is not a known error
// shape an error repeats.
const maxShownBody = 512

// decodeError reads any of the services' error shapes: the runner's
// {"error":"code","message":…,"details":…}; pkg/server's, the bus's and the
// Librarian's {"error":{"code":404,"status":…,"message":…,"field":…}}; MCP's
// JSON-RPC error; the gateway's google.rpc.Status {"code":5,"message":…}.
// Anything else is repeated, trimmed, as the message.
func decodeError(method, path string, status int, data []byte) *Error {
	e := &Error{Method: method, Path: path, StatusCode: status}
	var shape struct {
		Error   json.RawMessage `json:"error"`
		Code    *int            `json:"code"`
		Message string          `json:"message"`
		Details json.RawMessage `json:"details"`
		JSONRPC string          `json:"jsonrpc"`
	}
	if json.Unmarshal(data, &shape) == nil {
		var word string
		var inner struct {
			Code    *int   `json:"code"`
			Status  string `json:"status"`
			Message string `json:"message"`
			Field   string `json:"field"`
		}
		switch {
		case json.Unmarshal(shape.Error, &word) == nil && word != "":
			e.Code, e.Message = word, shape.Message
			_ = json.Unmarshal(shape.Details, &e.Details) // the gateway's details are a list
		case json.Unmarshal(shape.Error, &inner) == nil && inner.Message != "":
			e.Code, e.Message, e.Field = inner.Status, inner.Message, inner.Field
			if shape.JSONRPC != "" && inner.Code != nil {
				e.Code = fmt.Sprintf("JSON-RPC %d", *inner.Code)
			}
		case shape.Code != nil && shape.Message != "":
			e.Code, e.Message = codes.Code(*shape.Code).String(), shape.Message
		}
		if e.Message != "" {
			return e
		}
	}
	text := strings.ToValidUTF8(strings.TrimSpace(string(data)), "?")
	if len(text) > maxShownBody {
		cut := maxShownBody
		for !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "…"
	}
	e.Message = text
	return e
}
