// Package review is the human review page that human_review_url opens:
// server-rendered html/template pages listing the escalated requests and
// showing one with its content, references and validation results, with
// approve and reject forms. A reviewer signs in with a reviewer token, kept
// in an HttpOnly, SameSite=Strict cookie; every form carries a CSRF token
// derived from that session, checked in constant time.
package review

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/api"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
)

// Backend is what the pages need from the API.
type Backend interface {
	Request(ctx context.Context, id string) (requests.Record, error)
	Escalated(ctx context.Context) ([]requests.Record, error)
	Decide(ctx context.Context, reviewer access.Principal, id string, d api.Decision) (requests.Record, error)
	Authenticate(r *http.Request, token string) (access.Principal, error)
}

// Options tune the pages.
type Options struct {
	// Secure marks the cookie Secure (the API is served over https).
	Secure bool
	// AllowUnauthenticated lets anyone review (conclave dev, loopback).
	AllowUnauthenticated bool
}

// CookieName is the session cookie.
const CookieName = "librarian_review"

const maxFormBytes = 16 << 10

type pages struct {
	b Backend
	o Options
	// devKey signs CSRF tokens when there is no session (development).
	devKey []byte
}

// Register adds the review pages to mux.
func Register(mux *http.ServeMux, b Backend, o Options) {
	p := &pages{b: b, o: o, devKey: make([]byte, 32)}
	_, _ = rand.Read(p.devKey)
	mux.HandleFunc("GET /review", p.list)
	mux.HandleFunc("GET /review/signin", p.signinForm)
	mux.HandleFunc("POST /review/signin", p.signin)
	mux.HandleFunc("POST /review/signout", p.signout)
	mux.HandleFunc("GET /review/{request_id}", p.show)
	mux.HandleFunc("POST /review/{request_id}", p.decide)
}

// session returns the signed-in reviewer and the key of its CSRF tokens,
// or false (and a redirect to sign-in has been written).
func (p *pages) session(w http.ResponseWriter, r *http.Request) (access.Principal, []byte, bool) {
	c, err := r.Cookie(CookieName)
	if err == nil && c.Value != "" {
		who, err := p.b.Authenticate(r, c.Value)
		if err == nil && who.Role == access.RoleReviewer {
			key := sha256.Sum256([]byte("csrf:" + c.Value))
			return who, key[:], true
		}
	}
	if p.o.AllowUnauthenticated {
		return access.Principal{Subject: "developer", Role: "dev"}, p.devKey, true
	}
	http.Redirect(w, r, "/review/signin?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
	return access.Principal{}, nil, false
}

func csrfToken(key []byte, requestID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("review:" + requestID))
	return hex.EncodeToString(m.Sum(nil))
}

func (p *pages) render(w http.ResponseWriter, status int, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = pageSet().ExecuteTemplate(w, name, data)
}

// pageSet parses the pages on first use rather than at Register: the
// Lambda's cold start does not wait for templates that only a reviewer's
// visit needs (bench/librarian). They are constants, so the parse cannot
// fail at run time unless it fails every test that renders a page.
var pageSet = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("").Funcs(template.FuncMap{"status": func(s governance.State) string { return s.Status() }}).Parse(pageTemplates))
})

func (p *pages) problem(w http.ResponseWriter, status int, msg string) {
	p.render(w, status, "problem", map[string]any{"Status": status, "Text": http.StatusText(status), "Message": msg})
}

func (p *pages) list(w http.ResponseWriter, r *http.Request) {
	who, _, ok := p.session(w, r)
	if !ok {
		return
	}
	recs, err := p.b.Escalated(r.Context())
	if err != nil {
		p.problem(w, http.StatusServiceUnavailable, "The requests could not be read; retry.")
		return
	}
	p.render(w, http.StatusOK, "list", map[string]any{"Reviewer": who.Subject, "Requests": recs})
}

func (p *pages) show(w http.ResponseWriter, r *http.Request) {
	who, key, ok := p.session(w, r)
	if !ok {
		return
	}
	id := r.PathValue("request_id")
	if err := api.CheckRequestID(id); err != nil {
		p.problem(w, http.StatusBadRequest, "That is not a request id: "+err.Error()+".")
		return
	}
	rec, err := p.b.Request(r.Context(), id)
	if errors.Is(err, requests.ErrNotFound) {
		p.problem(w, http.StatusNotFound, "There is no request "+id+".")
		return
	}
	if err != nil {
		p.problem(w, http.StatusServiceUnavailable, "The request could not be read; retry.")
		return
	}
	p.render(w, http.StatusOK, "show", map[string]any{"Reviewer": who.Subject, "R": rec, "CSRF": csrfToken(key, id),
		"Open": rec.State == governance.Escalated, "Message": r.URL.Query().Get("done")})
}

func (p *pages) decide(w http.ResponseWriter, r *http.Request) {
	who, key, ok := p.session(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		p.problem(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	id := r.PathValue("request_id")
	if !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(csrfToken(key, id))) {
		p.problem(w, http.StatusForbidden, "The form has expired or did not come from this page; reload it and try again.")
		return
	}
	_, err := p.b.Decide(r.Context(), who, id, api.Decision{Decision: r.PostForm.Get("decision"), Comment: r.PostForm.Get("comment")})
	if err != nil {
		status := http.StatusServiceUnavailable
		var ae interface{ HTTPStatus() int }
		if errors.As(err, &ae) {
			status = ae.HTTPStatus()
		}
		p.problem(w, status, err.Error())
		return
	}
	http.Redirect(w, r, "/review/"+url.PathEscape(id)+"?done="+url.QueryEscape(r.PostForm.Get("decision")+"d"), http.StatusSeeOther)
}

func (p *pages) signinForm(w http.ResponseWriter, r *http.Request) {
	p.render(w, http.StatusOK, "signin", map[string]any{"Next": safeNext(r.URL.Query().Get("next"))})
}

func (p *pages) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		p.problem(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	who, err := p.b.Authenticate(r, token)
	if wait := api.RetryAfter(err); wait != "" {
		w.Header().Set("Retry-After", wait)
		p.problem(w, http.StatusTooManyRequests, "Too many wrong tokens came from this address; wait "+wait+" s and try again.")
		return
	}
	if err != nil || who.Role != access.RoleReviewer {
		p.render(w, http.StatusUnauthorized, "signin", map[string]any{"Next": safeNext(r.PostForm.Get("next")), "Error": "That is not a reviewer token."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: token, Path: "/review", HttpOnly: true, Secure: p.o.Secure, SameSite: http.SameSiteStrictMode, MaxAge: 8 * 3600})
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (p *pages) signout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/review", HttpOnly: true, Secure: p.o.Secure, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/review/signin", http.StatusSeeOther)
}

// safeNext keeps a redirect target on this site's review pages.
func safeNext(next string) string {
	if strings.HasPrefix(next, "/review") && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return "/review"
}

const pageTemplates = `
{{define "head"}}<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{{.}} · Librarian review</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:.8rem;overflow:auto;white-space:pre-wrap}.status{font-weight:bold;text-transform:uppercase}
.pass{color:#276}.warn{color:#a60}.reject,.deny{color:#b22}.escalate,.clarify{color:#a60}textarea{width:100%;min-height:5rem}
button{font-size:1rem;padding:.4rem 1rem;margin-right:.5rem}.done{background:#e6f4ea;padding:.5rem}</style></head><body>{{end}}

{{define "list"}}{{template "head" "Waiting for review"}}
<h1>Requests waiting for review</h1><p>Signed in as {{.Reviewer}}.</p>
{{if .Requests}}<table id="requests"><tr><th>Request</th><th>Agent</th><th>Type</th><th>Target</th><th>Reason</th><th>Submitted</th></tr>
{{range .Requests}}<tr><td><a href="/review/{{.ID}}">{{.ID}}</a></td><td>{{.AgentID}}</td><td>{{.Request.RequestType}} {{.Request.Action}}</td>
<td>{{.Request.TargetType}} {{.Request.GetTargetPath}}</td><td>{{.Response.GetEscalationReason}}</td><td>{{.CreatedAt.Format "2006-01-02 15:04Z"}}</td></tr>{{end}}
</table>{{else}}<p id="empty">Nothing waits for a review.</p>{{end}}</body></html>{{end}}

{{define "show"}}{{template "head" .R.ID}}
<p><a href="/review">← all waiting requests</a> · signed in as {{.Reviewer}}</p>
<h1>Request {{.R.ID}}</h1>
{{if .Message}}<p class="done" id="done">Request {{.Message}}.</p>{{end}}
<p>Status: <span class="status" id="status">{{status .R.State}}</span></p>
<table>
<tr><th>Agent</th><td>{{.R.AgentID}} (session {{.R.Request.SessionId}})</td></tr>
<tr><th>Request</th><td>{{.R.Request.RequestType}} {{.R.Request.Action}} {{.R.Request.TargetType}}</td></tr>
<tr><th>Target</th><td>{{.R.Request.GetTargetPath}} {{.R.Request.GetTargetId}}</td></tr>
<tr><th>Rationale</th><td>{{.R.Request.Rationale}}</td></tr>
<tr><th>Risk</th><td>{{.R.Request.GetRiskAssessment}}</td></tr>
<tr><th>References</th><td>{{range .R.Request.References}}<code>{{.}}</code> {{else}}none{{end}}</td></tr>
<tr><th>Depends on</th><td>{{range .R.Request.DependsOn}}<code>{{.}}</code> {{else}}none{{end}}</td></tr>
<tr><th>Escalated because</th><td>{{.R.Response.GetEscalationReason}}</td></tr>
<tr><th>Confidence</th><td>{{printf "%.2f" .R.Response.Confidence}}</td></tr>
</table>
<h2>Content</h2><pre id="content">{{.R.Request.Content}}</pre>
<h2>Validation results</h2><table id="results"><tr><th>Rule</th><th>Verdict</th><th>Detail</th><th>ms</th></tr>
{{range .R.Results}}<tr><td>{{.Rule}}</td><td class="{{.Verdict}}">{{.Verdict}}</td><td>{{.Detail}}</td><td>{{printf "%.2f" .Millis}}</td></tr>{{end}}</table>
{{with .R.Review}}<h2>Decision</h2><p id="decision">{{.Decision}}d by {{.Reviewer}}: {{.Comment}}</p>{{end}}
{{if .Open}}<h2>Decide</h2>
<form method="post" action="/review/{{.R.ID}}" id="decide">
<input type="hidden" name="csrf" value="{{.CSRF}}">
<label for="comment">Comment (required)</label><textarea id="comment" name="comment" required maxlength="4096"></textarea>
<p><button type="submit" name="decision" value="approve" id="approve">Approve</button>
<button type="submit" name="decision" value="reject" id="reject">Reject</button></p>
</form>{{end}}</body></html>{{end}}

{{define "signin"}}{{template "head" "Sign in"}}
<h1>Reviewer sign-in</h1>{{with .Error}}<p class="reject" id="error">{{.}}</p>{{end}}
<form method="post" action="/review/signin"><input type="hidden" name="next" value="{{.Next}}">
<label for="token">Reviewer token</label> <input type="password" id="token" name="token" autocomplete="off" required>
<button type="submit" id="signin">Sign in</button></form></body></html>{{end}}

{{define "problem"}}{{template "head" .Text}}<h1>{{.Status}} {{.Text}}</h1><p id="problem">{{.Message}}</p>
<p><a href="/review">Back to the waiting requests</a></p></body></html>{{end}}
`
