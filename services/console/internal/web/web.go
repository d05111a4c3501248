// Package web is the console's HTTP side: server-rendered pages
// (html/template), the sign-in and its encrypted session cookie, CSRF
// checks on every state-changing request, small JavaScript modules served
// from the console itself, and the Server-Sent Event streams they read.
package web

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/metrics"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configure the console's pages.
type Options struct {
	Codec *session.Codec
	// Open serves the console without sign-in: a visitor without a
	// session gets one with no tokens (conclave dev, on loopback).
	Open bool
	// JaegerURL is Jaeger's UI as the browser reaches it: the console's
	// trace pages link there, and without JaegerQueryURL trace ids do.
	JaegerURL string
	// JaegerQueryURL, when set, is Jaeger's query API as the console
	// reaches it (Jaeger calls it): every trace id links to the console's
	// own page of its trace.
	JaegerQueryURL string
	// LibrarianAgentID is the agent the knowledge-graph search asks as.
	LibrarianAgentID string

	Gateway   backend.Gateway
	Bus       backend.Bus
	Runner    backend.Runner
	Librarian backend.Librarian
	Jaeger    backend.Jaeger

	// RefreshInterval is how often live lists (agents, an instance's
	// status) are read again.
	RefreshInterval time.Duration
	// MaxStreams bounds the live streams open at once; StreamMaxAge ends
	// each after a while, and the browser's EventSource reconnects.
	MaxStreams   int
	StreamMaxAge time.Duration
	// ChatTimeout bounds one chat with an agent.
	ChatTimeout time.Duration
	// MaxChats bounds the chats kept in memory.
	MaxChats int

	// SignInThrottle counts sign-ins whose tokens a service refused, per
	// address (nil: none): the services see every sign-in coming from the
	// console's own address, so the console slows a guesser down itself.
	SignInThrottle *auth.Throttle

	Metrics *metrics.Metrics
	Logger  *slog.Logger
}

// Handler serves the console.
type Handler struct {
	o         Options
	tmpl      *template.Template
	chats     *chatStore
	instances *recent[knownInstance]
	decisions *recent[decision]
	// decisionsMu makes merging the console's and the bus's copies of one
	// decision a single step (each reads, then replaces).
	decisionsMu sync.Mutex
	streams     atomic.Int64
	// base is cancelled when the console shuts down; chats run under it.
	base context.Context
}

// New builds the handler. base bounds the work that outlives a request
// (chats with agents).
func New(base context.Context, o Options) (*Handler, error) {
	if o.Codec == nil {
		return nil, errors.New("web: a session codec is required")
	}
	if o.Metrics == nil {
		o.Metrics = metrics.Discard()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{o: o, base: base,
		chats:     newChatStore(o.MaxChats),
		instances: newRecent[knownInstance](500),
		decisions: newRecent[decision](50),
	}
	t, err := template.New("").Funcs(template.FuncMap{
		"trace": h.traceRef,
		"ts":    formatTime,
		"pbts":  func(t *timestamppb.Timestamp) string { return formatProtoTime(t) },
		"json":  prettyJSON,
		"join":  strings.Join,
		"since": func(t *timestamppb.Timestamp) string { return since(t) },
		"dur":   duration,
		// pathEscape makes a value one segment of a URL path: html/template
		// leaves "/", "?" and ".." in a path as they are.
		"pathEscape": pathEscape,
	}).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("web templates: %w", err)
	}
	h.tmpl = t
	return h, nil
}

// Routes registers the console's routes: unary for bounded requests,
// stream for the live ones (no deadline, ended on drain).
func (h *Handler) Routes(unary, stream func(pattern string, handler http.Handler)) {
	static, _ := fs.Sub(staticFS, "static")
	unary("GET /static/", http.StripPrefix("/static/", h.staticFiles(static)))
	unary("GET /signin", http.HandlerFunc(h.signinForm))
	unary("POST /signin", http.HandlerFunc(h.signin))
	unary("POST /signout", h.session(h.signout))
	unary("GET /{$}", h.session(h.overview))
	unary("GET /agents", h.session(h.agents))
	unary("POST /chats", h.session(h.startChat))
	unary("GET /chats/{id}", h.session(h.showChat))
	unary("GET /agents/{id}/threads", h.session(h.threads))
	unary("GET /threads/{id}", h.session(h.thread))
	unary("POST /chats/{id}/cancel", h.session(h.cancelChat))
	unary("GET /bus", h.session(h.bus))
	unary("POST /bus/publish", h.session(h.publish))
	unary("GET /bus/dead-letters/{id}", h.session(h.deadLetter))
	unary("POST /bus/dead-letters/{id}/redrive", h.session(h.redrive))
	unary("POST /bus/dead-letters/redrive", h.session(h.redrive))
	unary("GET /runner", h.session(h.runner))
	unary("GET /runner/find", h.session(h.findInstance))
	unary("POST /runner/launch", h.session(h.launch))
	unary("GET /runner/instances/{id}", h.session(h.instance))
	unary("GET /traces/{id}", h.session(h.traceView))
	unary("POST /runner/instances/{id}/prompt", h.session(h.prompt))
	unary("POST /runner/instances/{id}/cancel", h.session(h.cancelInstance))
	unary("GET /librarian", h.session(h.librarian))
	unary("POST /librarian/reviews/{id}/decision", h.session(h.decide))

	stream("GET /live/agents", h.session(h.liveAgents))
	stream("GET /chats/{id}/events", h.session(h.chatEvents))
	stream("GET /live/bus", h.session(h.liveBus))
	stream("GET /live/runner/{id}/logs", h.session(h.liveLogs))
}

func (h *Handler) staticFiles(root fs.FS) http.Handler {
	files := http.FileServerFS(root)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})
}

// maxFormBytes bounds a form: a chat message may be 256 KiB.
const maxFormBytes = 300 << 10

// sessionHandler is a route that needs a session.
type sessionHandler func(w http.ResponseWriter, r *http.Request, s session.Session)

// session resolves the request's session before h runs: a valid one, or a
// new open one on an open console, or else a redirect to sign-in (a 401
// for script and stream requests). State-changing requests must also
// carry the session's CSRF token, in the form's csrf field or the
// X-CSRF-Token header, and come from this origin.
func (h *Handler) session(next sessionHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := h.o.Codec.Read(r)
		switch {
		case err == nil:
		case errors.Is(err, session.ErrNoSession) && h.o.Open:
			s = h.o.Codec.New(session.Tokens{}, true)
			ck, err := h.o.Codec.Cookie(s)
			if err != nil {
				h.problem(w, r, http.StatusInternalServerError, "The session could not be created.")
				return
			}
			http.SetCookie(w, ck)
		default:
			if !errors.Is(err, session.ErrNoSession) {
				h.o.Metrics.Refused(metrics.RefusedExpired)
				http.SetCookie(w, h.o.Codec.Clear())
			}
			h.toSignIn(w, r, errors.Is(err, session.ErrExpired) || errors.Is(err, session.ErrInvalid))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				h.problem(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
				return
			}
			token := r.Header.Get("X-CSRF-Token")
			if token == "" {
				token = r.PostForm.Get("csrf")
			}
			if !sameOrigin(r) || !h.o.Codec.CheckCSRF(s, token) {
				h.o.Metrics.Refused(metrics.RefusedCSRF)
				h.problem(w, r, http.StatusForbidden, "The form has expired or did not come from this console; reload the page and try again.")
				return
			}
		}
		next(w, r, s)
	})
}

// sameOrigin refuses a request whose Origin header names another site.
// Browsers send Origin on every POST; a request without one (a program),
// or with "null" (a privacy setting), still needs the CSRF token. The
// sign-in refuses "null" besides (signinFromThisConsole).
func sameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" {
		return true
	}
	u, err := url.Parse(origin)
	return err == nil && u.Host == r.Host
}

// wantsJSON is a request from the console's scripts (fetch) or an
// EventSource, which should get a status and a JSON body, not a page.
func wantsJSON(r *http.Request) bool {
	a := r.Header.Get("Accept")
	return strings.Contains(a, "application/json") || strings.Contains(a, "text/event-stream")
}

func (h *Handler) toSignIn(w http.ResponseWriter, r *http.Request, expired bool) {
	if wantsJSON(r) {
		msg := "sign in first"
		if expired {
			msg = "the session has expired; sign in again"
		}
		writeJSONError(w, http.StatusUnauthorized, msg)
		return
	}
	q := url.Values{}
	if r.Method == http.MethodGet {
		q.Set("next", r.URL.RequestURI())
	}
	if expired {
		q.Set("expired", "1")
	}
	http.Redirect(w, r, "/signin?"+q.Encode(), http.StatusSeeOther)
}

// page is what every page template gets.
type page struct {
	Title   string
	Section string
	CSRF    string
	Open    bool
	// Flash is a short confirmation at the top of the page.
	Flash string
	D     any
}

func securityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	// Every asset comes from the console: no inline script or style, no
	// other host, no framing.
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer browsers send
	// "Origin: null" with the console's own form posts.
	hd.Set("Referrer-Policy", "same-origin")
}

// render writes a page. It renders into a buffer first so that a template
// error becomes a 500 page rather than half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, s session.Session, p page) {
	p.CSRF = h.o.Codec.CSRFToken(s)
	p.Open = h.o.Open
	var buf bytes.Buffer
	if err := h.tmpl.ExecuteTemplate(&buf, name, p); err != nil {
		h.o.Logger.ErrorContext(r.Context(), "console template failed", "template", name, "error", err)
		status = http.StatusInternalServerError
		buf.Reset()
		_ = h.tmpl.ExecuteTemplate(&buf, "problem", page{Title: "Error", D: problemData{Status: status, Text: http.StatusText(status), Message: "The page could not be drawn."}})
	}
	securityHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type problemData struct {
	Status  int
	Text    string
	Message string
}

// problem answers an error in the console's one error shape (see
// WriteHTTPError), or as a readable page to a browser that navigated here
// (its Accept names text/html).
func (h *Handler) problem(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		writeJSONError(w, status, msg)
		return
	}
	var buf bytes.Buffer
	_ = h.tmpl.ExecuteTemplate(&buf, "problem", page{Title: http.StatusText(status), D: problemData{Status: status, Text: http.StatusText(status), Message: msg}})
	securityHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// backendProblem answers a failed call to a service with the status that
// fits it.
func (h *Handler) backendProblem(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusBadGateway
	switch {
	case backend.IsKind(err, backend.Unauthorized):
		status = http.StatusForbidden
	case backend.IsKind(err, backend.Rejected):
		status = backend.StatusOf(err)
		if status < 400 || status > 499 {
			status = http.StatusBadRequest
		}
	}
	h.problem(w, r, status, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeJSONError writes the console's error shape, the one pkg/server
// writes: {"error":{"code":403,"message":"..."}}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg}})
}

// WriteHTTPError answers the errors the server writes itself
// (server.WithHTTPErrorWriter): 404 and 405 for what no route takes, 413
// for a body over the limit, 500 for a recovered panic, 503 while
// draining. It has no request to negotiate with, so a browser too gets
// the JSON shape.
func WriteHTTPError(w http.ResponseWriter, status int, msg string) {
	securityHeaders(w)
	writeJSONError(w, status, msg)
}

// checkID applies kind's rule (pkg/ids), the one the service that owns
// such ids applies: a refused id is a 400 naming the field, and never
// reaches that service. It reports whether the request may go on.
func (h *Handler) checkID(w http.ResponseWriter, r *http.Request, kind ids.Kind, id string) bool {
	if err := kind.Check(id); err != nil {
		h.problem(w, r, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}

// traceLink is a trace id and, when Jaeger is configured, the page that
// shows its trace.
type traceLink struct {
	ID  string
	URL string
}

func (h *Handler) traceRef(id string) traceLink {
	return traceLink{ID: id, URL: h.traceURL(id)}
}

func (h *Handler) traceURL(id string) string {
	switch {
	case id == "":
		return ""
	case h.o.JaegerQueryURL != "":
		return "/traces/" + url.PathEscape(id)
	case h.o.JaegerURL != "":
		return h.jaegerUI(id)
	}
	return ""
}

// jaegerUI is a trace's page in Jaeger's UI, or "" when it is not known.
func (h *Handler) jaegerUI(id string) string {
	if h.o.JaegerURL == "" {
		return ""
	}
	return strings.TrimSuffix(h.o.JaegerURL, "/") + "/trace/" + url.PathEscape(id)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func formatProtoTime(t *timestamppb.Timestamp) string {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return "—"
	}
	return formatTime(t.AsTime())
}

func since(t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	d := time.Since(t.AsTime()).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

// prettyJSON indents JSON for display, with <, > and & as themselves
// (the page escapes them, as text); what is not JSON is shown as is.
func prettyJSON(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return string(raw)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// safeNext keeps a redirect after sign-in on this console: a path on this
// host and nothing else. Browsers strip tabs and newlines from a URL and
// read "\\" as "/", so any control character or backslash is refused
// outright; what is left must parse with no scheme and no host, and its
// path must start with a single "/".
func safeNext(next string) string {
	for i := 0; i < len(next); i++ {
		if c := next[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "/"
		}
	}
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/signin") {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	return next
}

// validText checks a short field from a form: present, bounded, and free
// of control characters.
func validText(name, v string, max int) error {
	if v == "" {
		return fmt.Errorf("%s is required", name)
	}
	if len(v) > max {
		return fmt.Errorf("%s is longer than %d bytes", name, max)
	}
	for _, c := range v {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("%s contains a control character", name)
		}
	}
	return nil
}
