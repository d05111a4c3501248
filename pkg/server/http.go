package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Handle registers a unary HTTP route: one request, one bounded response.
// Like every route, its state-changing requests must be JSON, or the types
// given with AcceptContentTypes, or they get 415 before h runs (guard.go).
// Its handler gets a context deadline of Config.RequestTimeout and is subject
// to the connection's read and write deadlines. Patterns follow
// http.ServeMux, which also decides what an invalid or conflicting pattern
// does (it panics). A handler that reads the body and meets
// *http.MaxBytesError should answer 413, as the server does itself (with
// WriteError, or WithHTTPErrorWriter's function) when the handler writes
// nothing.
func (s *Server) Handle(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.unary(s.checkContentType(h)))
}

// HandleStream registers a streaming HTTP route (SSE, WebSocket, long poll).
// Such a response legitimately outlives any fixed deadline, so the route gets
// no request timeout and its connection's read and write deadlines are
// cleared. Its context is cancelled with cause ErrDraining when the server
// starts closing its listeners and no request of a HandleDrained route is
// running any more; the handler should then end the stream promptly, so that
// clients reconnect to another replica.
func (s *Server) HandleStream(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.streaming(s.checkContentType(h)))
}

// HandleDrained registers a long-running HTTP route whose requests are
// drained rather than cancelled: a request (a tool call, a job) may take
// longer than any fixed deadline and must not be cut just because the server
// is stopping. Like a streaming route it gets no request timeout and its
// connection deadlines are cleared, so its handler must bound its own time.
// When the server starts draining, requests already running keep their
// context and run to completion; requests that arrive after that are refused
// with 503 and Retry-After, so that the client goes to another replica.
// Streaming routes stay open until the drained requests have finished,
// because a client may be listening for their results there. A request still
// running when ShutdownTimeout passes has its context cancelled with cause
// ErrDrainDeadline, and its connection is closed.
func (s *Server) HandleDrained(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.drainedRoute(s.checkContentType(h)))
}

// WriteError writes the JSON error shape shared by Conclave's HTTP surfaces:
// {"error":{"code":413,"message":"..."}}.
func WriteError(w http.ResponseWriter, code int, message string) {
	writeJSON(w, code, errorResponse{Error: errorDetail{Code: code, Message: message}})
}

type errorResponse struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	// An encoding error here means the client went away; there is no one
	// left to tell.
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) unary(h http.Handler) http.Handler {
	timeout := s.cfg.RequestTimeout
	if timeout <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

func (s *Server) streaming(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clearDeadlines(w, r, s.logger)
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		stop := context.AfterFunc(s.streams, func() { cancel(context.Cause(s.streams)) })
		defer stop()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

func (s *Server) drainedRoute(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.startDrained() {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Connection", "close")
			s.writeError(w, http.StatusServiceUnavailable, "server is shutting down; retry on another replica")
			return
		}
		defer s.endDrained()
		clearDeadlines(w, r, s.logger)
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		stop := context.AfterFunc(s.drainExpired, func() { cancel(context.Cause(s.drainExpired)) })
		defer stop()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// clearDeadlines lifts the connection's read and write deadlines for a
// request that may outlive them.
func clearDeadlines(w http.ResponseWriter, r *http.Request, logger *slog.Logger) {
	// net/http arms the connection's deadlines from ReadTimeout and
	// WriteTimeout at the start of every request; on HTTP/1 an expired read
	// deadline even cancels the request context. Clearing both is what lets
	// a long response outlive them.
	rc := http.NewResponseController(w)
	if err := errors.Join(rc.SetWriteDeadline(time.Time{}), rc.SetReadDeadline(time.Time{})); err != nil {
		logger.WarnContext(r.Context(), "cannot clear connection deadlines; response is bounded by ReadTimeout and WriteTimeout",
			"path", r.URL.Path, "err", err)
	}
}

// httpCore is the middleware every route runs inside: panic recovery, the
// request body limit and a debug access log. It sits inside user middleware
// so that tracing sees the 500s and 413s it produces.
func (s *Server) httpCore(next http.Handler) http.Handler {
	limit := s.cfg.MaxRequestBodyBytes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &responseWriter{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				s.recoverHTTP(rw, r, v)
			}
			s.logHTTP(r, rw, start)
		}()
		if !s.hostAllowed(rw, r) {
			return
		}

		var body *limitedBody
		if limit > 0 {
			if r.ContentLength > limit {
				s.writeError(rw, http.StatusRequestEntityTooLarge, bodyTooLarge(limit))
				return
			}
			if r.Body != nil && r.Body != http.NoBody {
				// MaxBytesReader gets the original writer: net/http uses it
				// to close the connection instead of draining the rest.
				body = &limitedBody{ReadCloser: http.MaxBytesReader(w, r.Body, limit)}
				r.Body = body
			}
		}
		next.ServeHTTP(rw, r)
		if body != nil && body.exceeded.Load() && !rw.sent() {
			s.writeError(rw, http.StatusRequestEntityTooLarge, bodyTooLarge(limit))
		}
	})
}

func bodyTooLarge(limit int64) string {
	return fmt.Sprintf("request body exceeds %d bytes", limit)
}

func (s *Server) recoverHTTP(rw *responseWriter, r *http.Request, v any) {
	if v == http.ErrAbortHandler {
		// The sanctioned way to abort a response; net/http handles it quietly.
		panic(v)
	}
	s.logger.ErrorContext(r.Context(), "panic in HTTP handler",
		"method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
	switch {
	case rw.hijacked:
		// The connection belongs to the handler now; nothing to write to.
	case rw.status != 0:
		// The client already has a status line and perhaps part of a body.
		// Aborting the connection is the only way left to tell it the
		// response is incomplete; net/http recovers this panic silently.
		panic(http.ErrAbortHandler)
	default:
		s.writeError(rw, http.StatusInternalServerError, "internal error")
	}
}

func (s *Server) logHTTP(r *http.Request, rw *responseWriter, start time.Time) {
	ctx := r.Context()
	if !s.logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	status := rw.status
	if status == 0 && !rw.hijacked {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	s.logger.DebugContext(ctx, "http request",
		"method", r.Method, "path", r.URL.Path, "status", status, "duration", time.Since(start))
}

// limitedBody records that the body limit was hit, so that httpCore can
// answer 413 for a handler that gave up without writing a response.
type limitedBody struct {
	io.ReadCloser
	exceeded atomic.Bool // handlers may read the body from another goroutine
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		b.exceeded.Store(true)
	}
	return n, err
}

// responseWriter tracks whether the response has started, which decides
// whether a panic or an exceeded body limit can still be answered with an
// error response. It exposes Flush and Hijack because SSE and WebSocket code
// commonly type-asserts for them, and Unwrap for http.ResponseController.
type responseWriter struct {
	http.ResponseWriter
	status   int // 0 until the status line is sent
	hijacked bool
}

func (w *responseWriter) sent() bool { return w.status != 0 || w.hijacked }

func (w *responseWriter) WriteHeader(code int) {
	// Every 429 says when to come back, including those a library writes
	// (grpc-gateway's for RESOURCE_EXHAUSTED); one that said nothing gets
	// a second, the shortest a client should wait.
	if code == http.StatusTooManyRequests && w.status == 0 && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	// 1xx responses other than 101 are interim: the real status follows.
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *responseWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	// http.Flusher has no way to report failure; a broken connection shows
	// up on the next Write.
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return conn, brw, err
}

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, statusResponse{Status: "ok"})
}

// statusResponse is the body of /healthz and /readyz. Failed names the
// failing readiness checks but not their errors, which go to the log: the
// HTTP port is often the public API port.
type statusResponse struct {
	Status string   `json:"status"`
	Failed []string `json:"failed,omitempty"`
}

func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, statusResponse{Status: "draining"})
		return
	}
	s.mu.Lock()
	checks := slices.Clone(s.checks)
	s.mu.Unlock()

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []string
	)
	for _, c := range checks {
		wg.Go(func() {
			if err := runCheck(r.Context(), c.check); err != nil {
				s.logger.WarnContext(r.Context(), "readiness check failed", "check", c.name, "err", err)
				mu.Lock()
				failed = append(failed, c.name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		slices.Sort(failed)
		writeJSON(w, http.StatusServiceUnavailable, statusResponse{Status: "not_ready", Failed: failed})
		return
	}
	writeJSON(w, http.StatusOK, statusResponse{Status: "ready"})
}

// runCheck turns a panicking check into a failure: it runs on its own
// goroutine, where a panic would otherwise take the process down.
func runCheck(ctx context.Context, check func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	return check(ctx)
}
