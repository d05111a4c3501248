// Package govern asks the Librarian before an agent acts: a client of its
// agent API over HTTP (Client), a watcher of its decision events on the bus
// (Watcher), and the flow that joins them (Governor.Ask), which the runner
// uses for ACP session/request_permission and the bridge for governed
// tools. It fails closed: a request that cannot be asked, or whose answer
// does not come in time, is refused. See docs/governance.md.
package govern

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/httpclient"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// ErrUnavailable is wrapped by the errors of a Librarian that could not be
// reached or failed (a transport error, a 5xx, a 429 that outlasted the
// retries, an answer that is not its JSON).
var ErrUnavailable = errors.New("the Librarian is unavailable")

// Error is the Librarian's refusal of a call: a 4xx with its error body.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("the Librarian refused the request (HTTP %d %s): %s", e.Status, e.Code, e.Message)
}

// maxAnswerBytes bounds what the Librarian's answer may be: a response
// carries at most the request's content and its feedback.
const maxAnswerBytes = 4 << 20

// Client calls the Librarian's agent API (POST /agent/request, GET
// /agent/status/{id}) with a token of its own per agent: a Librarian agent
// token acts for one agent_id.
type Client struct {
	base   func() string
	tokens func(agentID string) string
	http   *http.Client
	// timeout is the per-call timeout, http's own when it has one.
	timeout time.Duration
	// Attempts bounds the tries of one call that the Librarian answers
	// with a transport error, a 5xx or a 429 (default 3); Backoff is the
	// first pause between them, doubling (default 200ms). A submission is
	// safe to repeat: it carries an idempotency key.
	Attempts int
	Backoff  time.Duration
}

// NewClient calls the Librarian at the URL base returns (its scheme, host
// and any path prefix, e.g. an API Gateway stage), presenting the token
// tokens gives for the agent a call is for, when there is one (nil: none,
// for a Librarian that takes none in development). hc carries the
// transport (tracing) and the per-call timeout (none is httpclient's
// default); nil is a client with a 15 s timeout.
func NewClient(base func() string, tokens func(agentID string) string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 15 * time.Second}
	}
	if tokens == nil {
		tokens = func(string) string { return "" }
	}
	return &Client{base: base, tokens: tokens, http: hc, timeout: hc.Timeout, Attempts: 3, Backoff: 200 * time.Millisecond}
}

var (
	marshal   = protojson.MarshalOptions{UseProtoNames: true}
	unmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// Submit sends req to POST /agent/request under the idempotency key: the
// same key sent again (a retry, a runner restarted mid-wait) is the same
// Librarian request, answered as it stands now.
func (c *Client) Submit(ctx context.Context, req *librarianv1.AgentRequest, key string) (*librarianv1.LibrarianResponse, error) {
	body, err := marshal.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	resp := &librarianv1.LibrarianResponse{}
	if err := c.do(ctx, http.MethodPost, "/agent/request", body, key, c.tokens(req.GetAgentId()), resp); err != nil {
		return nil, err
	}
	if resp.GetRequestId() == "" || resp.GetStatus() == "" {
		return nil, fmt.Errorf("%w: its answer has no request_id or status", ErrUnavailable)
	}
	return resp, nil
}

// Status reads GET /agent/status/{id} as agentID, whose request it is.
func (c *Client) Status(ctx context.Context, id, agentID string) (*librarianv1.RequestStatus, error) {
	st := &librarianv1.RequestStatus{}
	if err := c.do(ctx, http.MethodGet, "/agent/status/"+url.PathEscape(id), nil, "", c.tokens(agentID), st); err != nil {
		return nil, err
	}
	return st, nil
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, key, token string, out proto.Message) error {
	base := strings.TrimSuffix(c.base(), "/")
	if base == "" {
		return fmt.Errorf("%w: its address is not known", ErrUnavailable)
	}
	hc := &httpclient.Client{Base: base, Timeout: c.timeout, MaxResponse: maxAnswerBytes, HTTP: c.http}
	req := httpclient.Request{Method: method, Path: path, Token: token}
	if body != nil {
		req.Body = body
	}
	if key != "" {
		req.Header = http.Header{"Idempotency-Key": {key}}
	}
	pause := c.Backoff
	var last error
	for attempt := 1; ; attempt++ {
		retryAfter, err := c.once(ctx, hc, req, out)
		if err == nil {
			return nil
		}
		last = err
		if !errors.Is(err, ErrUnavailable) || attempt >= max(c.Attempts, 1) {
			return last
		}
		wait := max(pause, retryAfter)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return last
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(wait):
		}
		pause *= 2
	}
}

// once makes one call; a retryable failure wraps ErrUnavailable and may
// say how long the Librarian asked to wait.
func (c *Client) once(ctx context.Context, hc *httpclient.Client, req httpclient.Request, out proto.Message) (time.Duration, error) {
	data, err := hc.Send(ctx, req)
	var he *httpclient.Error
	switch {
	case errors.As(err, &he) && (he.StatusCode == http.StatusTooManyRequests || he.StatusCode >= 500):
		secs, _ := strconv.Atoi(he.Header.Get("Retry-After"))
		return time.Duration(min(max(secs, 0), 30)) * time.Second,
			fmt.Errorf("%w: HTTP %d: %s", ErrUnavailable, he.StatusCode, clip(he.Message, 300))
	case he != nil:
		return 0, &Error{Status: he.StatusCode, Code: he.Code, Message: clip(he.Message, 300)}
	case errors.Is(err, httpclient.ErrTooLarge):
		return 0, fmt.Errorf("%w: its answer is over %d bytes", ErrUnavailable, maxAnswerBytes)
	case err != nil:
		return 0, fmt.Errorf("%w: %s", ErrUnavailable, cleanError(err))
	}
	if err := unmarshal.Unmarshal(data, out); err != nil {
		return 0, fmt.Errorf("%w: its answer is not what the API says: %v", ErrUnavailable, err)
	}
	return 0, nil
}

// cleanError drops the URL from a transport error: it is known, and a
// query string has no business in a log.
func cleanError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
