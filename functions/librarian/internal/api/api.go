// Package api is the Librarian's HTTP surface, the same http.Handler behind
// API Gateway (through the Lambda adapter) and on :8081 locally: the
// protocol's /agent/* endpoints, human review, /docs and /metrics. Every
// answer to bad input is a 4xx with a JSON error body; a failing
// dependency is a 503, never a 500.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/store"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
)

// Publisher sends events.
type Publisher interface {
	Publish(ctx context.Context, envs ...*eventsv1.Envelope) error
}

// Stats records and reports the protocol's metrics.
type Stats interface {
	Record(ctx context.Context, status string, validation time.Duration) error
	// Ops are Record's writes, to make with the write of the decision.
	Ops(status string, validation time.Duration) []store.Op
	Snapshot(ctx context.Context) (map[string]any, error)
}

// Options are the handler's dependencies.
type Options struct {
	Policy   *policy.Policy
	Pipeline *governance.Pipeline
	Limiter  governance.Limiter
	// Reads counts GETs per caller against ReadRate.
	Reads    ReadLimiter
	ReadRate policy.Rate
	Requests *requests.Store
	Graph    *graph.Graph
	Tokens   *access.Tokens
	Static   *access.Static
	Events   Publisher
	Stats    Stats
	Observer Observer
	Logger   *slog.Logger
	// BaseURL is where the review pages are, for human_review_url; when
	// empty it is derived from each request's Host.
	BaseURL string
	// AllowUnauthenticated lets requests without a token act as the
	// agent_id they name, and as a reviewer (conclave dev, on loopback).
	AllowUnauthenticated bool
	// Throttle counts wrong tokens per address (nil: none). A Lambda
	// instance keeps its own counts.
	Throttle *auth.Throttle
	Now      func() time.Time
	// AwaitOutboxClear makes a submission's answer wait for the write that
	// clears its published events (the Lambda: a frozen execution
	// environment runs nothing after the answer). Otherwise that write
	// goes on after the answer.
	AwaitOutboxClear bool
}

// ReadLimiter counts reads.
type ReadLimiter interface {
	TakeRead(ctx context.Context, subject string, rate policy.Rate) (governance.Allowance, error)
}

// Observer is told about each decision, for metrics.
type Observer interface {
	Decided(ctx context.Context, requestType, status string, validation time.Duration)
	Refused(ctx context.Context, code int)
	Published(ctx context.Context, n int, err error)
}

// Handler is the Librarian's API.
type Handler struct {
	o   Options
	mux *http.ServeMux
	// clearing holds the outbox clears still in flight: request id → a
	// channel closed when the clear is over.
	clearing sync.Map
}

// envelopeOverhead is what JSON framing may add to content in a request
// body, beyond max_content_size: the other fields and escaping.
const envelopeOverhead = 64 << 10

// New returns the handler.
func New(o Options) *Handler {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	h := &Handler{o: o, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /agent/request", h.agent(h.submit))
	h.mux.HandleFunc("GET /agent/status/{request_id}", h.authed(h.status))
	h.mux.HandleFunc("POST /agent/context", h.agent(h.context))
	h.mux.HandleFunc("GET /agent/capabilities", h.agent(h.capabilities))
	h.mux.HandleFunc("GET /reviews", h.reviewer(h.listReviews))
	h.mux.HandleFunc("POST /reviews/{request_id}/decision", h.reviewer(h.decideReview))
	h.mux.HandleFunc("GET /docs", h.docs)
	h.mux.HandleFunc("GET /metrics", h.authed(h.metrics))
	h.mux.HandleFunc("/", h.noRoute)
	return h
}

// Mux lets other surfaces (the review pages) share the handler's routes.
func (h *Handler) Mux() *http.ServeMux { return h.mux }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.o.Policy.Protocol.Timeouts.Response)
	defer cancel()
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// The API takes JSON and the review pages their forms, nothing else:
	// a page elsewhere cannot send either type without a preflight.
	allowed := httpguard.JSON
	if r.URL.Path == "/review" || strings.HasPrefix(r.URL.Path, "/review/") {
		allowed = httpguard.Form
	}
	if err := httpguard.ContentType(r, allowed); err != nil {
		h.fail(w, r, &apiError{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type", Message: err.Error()})
		return
	}
	h.mux.ServeHTTP(w, r.WithContext(ctx))
}

// noRoute answers what no route matched: 405 with Allow when the path
// exists for another method, else 404, both as JSON.
func (h *Handler) noRoute(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := h.mux.Handler(probe); pattern != "/" {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 {
		h.fail(w, r, &apiError{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Message: fmt.Sprintf("%s takes %s", r.URL.Path, strings.Join(allowed, ", ")),
			Headers: map[string]string{"Allow": strings.Join(allowed, ", ")}})
		return
	}
	h.fail(w, r, &apiError{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("no route for %s %s", r.Method, clip(r.URL.Path))})
}

type nopObserver struct{}

func (nopObserver) Decided(context.Context, string, string, time.Duration) {}
func (nopObserver) Refused(context.Context, int)                           {}
func (nopObserver) Published(context.Context, int, error)                  {}

// apiError is an error with its HTTP answer.
type apiError struct {
	Status  int
	Code    string
	Message string
	Field   string
	Headers map[string]string
}

func (e *apiError) Error() string { return e.Message }

type errorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Status  string `json:"status"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	} `json:"error"`
}

// WriteHTTPError answers, in the Librarian's error body, the errors
// pkg/server writes itself (server.WithHTTPErrorWriter): a body over the
// server's limit (413), a recovered panic (500), draining (503).
func WriteHTTPError(w http.ResponseWriter, status int, message string) {
	code := map[int]string{
		http.StatusNotFound: "not_found", http.StatusMethodNotAllowed: "method_not_allowed",
		http.StatusRequestEntityTooLarge: "request_too_large", http.StatusUnsupportedMediaType: "unsupported_media_type",
		http.StatusTooManyRequests: "rate_limited", http.StatusServiceUnavailable: "unavailable",
	}[status]
	switch {
	case code != "":
	case status >= 500:
		code = "internal"
	default:
		code = "bad_request"
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	writeError(w, &apiError{Status: status, Code: code, Message: message})
}

func writeError(w http.ResponseWriter, e *apiError) {
	for k, v := range e.Headers {
		w.Header().Set(k, v)
	}
	if e.Status == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "" {
		// Every 429 says when to come back; the Lambda has no pkg/server
		// to add it.
		w.Header().Set("Retry-After", "1")
	}
	var b errorBody
	b.Error.Code, b.Error.Status, b.Error.Message, b.Error.Field = e.Status, e.Code, e.Message, e.Field
	writeJSON(w, e.Status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeProto(w http.ResponseWriter, status int, m proto.Message) {
	b, err := marshal.Marshal(m)
	if err != nil {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Code: "encoding_failed", Message: "the response could not be encoded"})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// fail answers err: an *apiError as it says, a denial with its status, an
// expired deadline or a failing dependency with 503.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var denial *governance.Denial
	var input *governance.InputError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &input):
		ae = &apiError{Status: input.Status, Code: input.Code, Message: input.Message, Field: input.Field}
	case errors.As(err, &denial):
		ae = &apiError{Status: denial.Status, Code: denial.Code, Message: denial.Reason}
		if a := denial.Allowance; a != nil {
			ae.Headers = rateHeaders(*a, h.o.Now())
		}
	case errors.Is(err, context.DeadlineExceeded):
		ae = &apiError{Status: http.StatusServiceUnavailable, Code: "timeout", Message: "the Librarian did not decide in time; retry", Headers: map[string]string{"Retry-After": "1"}}
		h.o.Logger.WarnContext(r.Context(), "request timed out", "path", r.URL.Path, "error", err)
	default:
		ae = &apiError{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the Librarian's store or queue is unavailable; retry", Headers: map[string]string{"Retry-After": "1"}}
		h.o.Logger.ErrorContext(r.Context(), "request failed", "path", r.URL.Path, "error", err)
	}
	h.o.Observer.Refused(r.Context(), ae.Status)
	writeError(w, ae)
}

func rateHeaders(a governance.Allowance, now time.Time) map[string]string {
	wait := max(int(a.Reset.Sub(now).Seconds()+0.999), 1)
	return map[string]string{
		"Retry-After":           strconv.Itoa(wait),
		"X-RateLimit-Limit":     strconv.Itoa(a.Limit),
		"X-RateLimit-Remaining": strconv.Itoa(a.Remaining),
		"X-RateLimit-Reset":     strconv.FormatInt(a.Reset.Unix(), 10),
		"X-RateLimit-Scope":     a.Name,
	}
}

type principalKey struct{}

// caller authenticates r: 401 for a missing or bad token.
func (h *Handler) caller(r *http.Request) (access.Principal, error) {
	header := r.Header.Get("Authorization")
	if header == "" {
		if h.o.AllowUnauthenticated {
			return access.Principal{Role: "dev", TokenID: "dev"}, nil
		}
		return access.Principal{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: `send "Authorization: Bearer <token>"`,
			Headers: map[string]string{"WWW-Authenticate": `Bearer realm="librarian"`}}
	}
	if wait := h.o.Throttle.Refused(r.Context(), r.RemoteAddr); wait > 0 {
		return access.Principal{}, &apiError{Status: http.StatusTooManyRequests, Code: "too_many_wrong_tokens", Message: auth.ThrottledMessage,
			Headers: map[string]string{"Retry-After": auth.RetryAfter(wait)}}
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		h.o.Throttle.Fail(r.RemoteAddr)
		return access.Principal{}, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: `the Authorization header must be "Bearer <token>"`}
	}
	if p, ok := h.o.Static.Verify(token); ok {
		return p, nil
	}
	p, err := h.o.Tokens.Verify(r.Context(), token)
	if errors.Is(err, access.ErrUnauthenticated) {
		h.o.Throttle.Fail(r.RemoteAddr)
		return p, &apiError{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "invalid or revoked token",
			Headers: map[string]string{"WWW-Authenticate": `Bearer realm="librarian", error="invalid_token"`}}
	}
	return p, err
}

func principal(ctx context.Context) access.Principal {
	p, _ := ctx.Value(principalKey{}).(access.Principal)
	return p
}

type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// authed admits any authenticated caller.
func (h *Handler) authed(fn handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := h.caller(r)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
		if r.Method == http.MethodGet && h.o.Reads != nil {
			if err := h.takeRead(r.Context(), p); err != nil {
				h.fail(w, r, err)
				return
			}
		}
		if err := fn(w, r); err != nil {
			h.fail(w, r, err)
		}
	}
}

// takeRead spends one read of the caller's budget: 429 when it is gone.
func (h *Handler) takeRead(ctx context.Context, p access.Principal) error {
	subject := p.Role + ":" + p.Subject
	a, err := h.o.Reads.TakeRead(ctx, subject, h.o.ReadRate)
	if err != nil {
		return err
	}
	if !a.Allowed {
		return &governance.Denial{Status: http.StatusTooManyRequests, Code: "rate_limited", Allowance: &a,
			Reason: fmt.Sprintf("read limit exceeded: %d reads per %s; retry after %s", a.Limit, h.o.ReadRate.Window, a.Reset.UTC().Format("15:04:05Z"))}
	}
	return nil
}

// agent admits agents (and, in development, anyone).
func (h *Handler) agent(fn handlerFunc) http.HandlerFunc {
	return h.authed(func(w http.ResponseWriter, r *http.Request) error {
		if p := principal(r.Context()); p.Role == access.RoleReviewer {
			return &apiError{Status: http.StatusForbidden, Code: "agents_only", Message: "a reviewer token cannot act as an agent"}
		}
		return fn(w, r)
	})
}

// reviewer admits reviewers (and, in development, anyone).
func (h *Handler) reviewer(fn handlerFunc) http.HandlerFunc {
	return h.authed(func(w http.ResponseWriter, r *http.Request) error {
		if p := principal(r.Context()); p.Role == access.RoleAgent {
			return &apiError{Status: http.StatusForbidden, Code: "reviewers_only", Message: "only a reviewer token may list or decide reviews"}
		}
		return fn(w, r)
	})
}

// agentFor returns the registry entry the caller acts as: its token's
// agent, or in development the agent_id it names. A token for another
// agent than the one named is 403.
func (h *Handler) agentFor(ctx context.Context, named string) (policy.Agent, error) {
	if named != "" {
		if err := ids.AgentID.Check(named); err != nil {
			return policy.Agent{}, &apiError{Status: http.StatusBadRequest, Code: "invalid_agent_id", Field: "agent_id", Message: err.Error()}
		}
	}
	p := principal(ctx)
	id := p.Subject
	switch {
	case p.Role == "dev":
		id = named
		if id == "" {
			return policy.Agent{}, &apiError{Status: http.StatusBadRequest, Code: "missing_agent_id", Field: "agent_id", Message: "agent_id is required"}
		}
	case named != "" && named != p.Subject:
		return policy.Agent{}, &apiError{Status: http.StatusForbidden, Code: "token_for_another_agent", Field: "agent_id",
			Message: fmt.Sprintf("this token belongs to agent %q, not %q", p.Subject, clip(named))}
	}
	a, ok := h.o.Policy.Agent(id)
	if !ok {
		return a, &apiError{Status: http.StatusForbidden, Code: "agent_not_authorized",
			Message: fmt.Sprintf("agent not authorized: %q is not in config/agents.yaml", clip(id))}
	}
	return a, nil
}

// CheckRequestID applies the Librarian request id's rule: pkg/ids' rule
// for every id (UTF-8, length, characters), then the Librarian's own form
// ("req-" and 16 base32 characters). A refused id is a 400 naming
// request_id, answered before the store is asked.
func CheckRequestID(id string) error {
	if err := ids.LibrarianRequestID.Check(id); err != nil {
		return &apiError{Status: http.StatusBadRequest, Code: "invalid_request_id", Field: "request_id", Message: err.Error()}
	}
	if !requests.ValidID(id) {
		return &apiError{Status: http.StatusBadRequest, Code: "invalid_request_id", Field: "request_id",
			Message: "request_id is not one the Librarian issues (\"req-\" and 16 base32 characters)"}
	}
	return nil
}

// readBody reads at most limit bytes, 413 beyond.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large", Message: fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, limit)}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large", Message: fmt.Sprintf("the body is over %d bytes", mbe.Limit)}
		}
		return nil, &apiError{Status: http.StatusBadRequest, Code: "unreadable_body", Message: "the request body could not be read"}
	}
	if int64(len(body)) > limit {
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "request_too_large", Message: fmt.Sprintf("the body is over %d bytes", limit)}
	}
	return body, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// HTTPStatus is the status the error is answered with.
func (e *apiError) HTTPStatus() int { return e.Status }
