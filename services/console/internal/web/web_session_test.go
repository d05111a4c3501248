package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/services/console/internal/session"
)

func TestExpiredSessionGoesToSignIn(t *testing.T) {
	t.Parallel()
	svc := services(t)
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			t.Parallel()
			e := newConsole(t, open, svc.URL, svc.URL, svc.URL, svc.URL)
			s := e.codec.New(session.Tokens{Gateway: "t"}, false)
			s.Expires = time.Now().Add(-time.Minute).Unix()
			ck := e.cookie(t, s)
			ck.MaxAge = 0
			resp, _ := e.do(t, "GET", "/agents", ck, nil, nil)
			if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/signin?") ||
				!strings.Contains(resp.Header.Get("Location"), "expired=1") {
				t.Fatalf("expired session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
			}
			// A stream or a script gets 401 and JSON instead.
			resp, body := e.do(t, "GET", "/live/agents", ck, nil, map[string]string{"Accept": "text/event-stream"})
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "expired") {
				t.Fatalf("expired session on a stream: %d %s", resp.StatusCode, body)
			}
			// The sign-in page says so.
			resp, body = e.do(t, "GET", "/signin?expired=1", nil, nil, nil)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="expired"`) {
				t.Fatalf("sign-in page: %d %s", resp.StatusCode, body)
			}
		})
	}
}

func TestNoSession(t *testing.T) {
	t.Parallel()
	svc := services(t)
	closed := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	resp, _ := closed.do(t, "GET", "/runner?x=1", nil, nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/signin?next=%2Frunner%3Fx%3D1" {
		t.Fatalf("closed console without a session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	open := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	resp, body := open.do(t, "GET", "/agents", nil, nil, nil)
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("open console without a session: %d %v", resp.StatusCode, resp.Cookies())
	}
	if !strings.Contains(body, `name="csrf-token"`) {
		t.Fatal("the page carries no CSRF token")
	}
}

func TestFormsNeedTheSessionsCSRFToken(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	s := e.codec.New(session.Tokens{Gateway: "t"}, false)
	ck := e.cookie(t, s)
	good := e.codec.CSRFToken(s)
	other := e.codec.CSRFToken(e.codec.New(session.Tokens{}, false))
	posts := []string{"/signout", "/chats", "/chats/x/cancel", "/bus/publish", "/bus/dead-letters/dl1/redrive", "/bus/dead-letters/redrive",
		"/runner/launch", "/runner/instances/i1/prompt", "/runner/instances/i1/cancel", "/librarian/reviews/req-1/decision"}
	tests := []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no token", url.Values{"x": {"1"}}, nil},
		{"another session's token", url.Values{"csrf": {other}}, nil},
		{"the token from another site", url.Values{"csrf": {good}}, map[string]string{"Origin": "http://evil.example"}},
	}
	for _, path := range posts {
		for _, tt := range tests {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				resp, body := e.do(t, "POST", path, ck, tt.form, tt.header)
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "did not come from this console") {
					t.Fatalf("POST %s: %d %s", path, resp.StatusCode, body)
				}
			})
		}
	}
	// A script's request gets the JSON error shape.
	resp, body := e.do(t, "POST", "/chats", ck, url.Values{}, map[string]string{"Accept": "application/json"})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, `"code":403`) {
		t.Fatalf("JSON 403: %d %s", resp.StatusCode, body)
	}
	// With the token, the same form goes through (to the Librarian).
	resp, _ = e.do(t, "POST", "/librarian/reviews/req-1/decision", ck, url.Values{"csrf": {good}, "decision": {"maybe"}, "comment": {"c"}}, map[string]string{"Origin": e.srv.URL})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a form with the token was refused: %d", resp.StatusCode)
	}
}

// signinForm gets the sign-in form: its pre-session cookie and the
// token its hidden field repeats.
func (e *consoleEnv) signinForm(t *testing.T) (*http.Cookie, string) {
	t.Helper()
	resp, body := e.do(t, "GET", "/signin", nil, nil, nil)
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == session.SignInCookieName {
			ck = c
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("the sign-in form's cookie: %+v", resp.Cookies())
	}
	const field = `name="signin_csrf" value="`
	i := strings.Index(body, field)
	if i < 0 {
		t.Fatalf("no sign-in token in the form:\n%s", body)
	}
	tok, _, _ := strings.Cut(body[i+len(field):], `"`)
	if tok != ck.Value {
		t.Fatalf("the form's token %q is not the cookie's %q", tok, ck.Value)
	}
	return ck, tok
}

func TestSignIn(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	ck, tok := e.signinForm(t)
	resp, body := e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}, "gateway_token": {"bad"}, "next": {"/agents"}}, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "gateway refused its token") || !strings.Contains(body, tok) {
		t.Fatalf("a refused token: %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "at least one token") {
		t.Fatalf("no token: %d %s", resp.StatusCode, body)
	}
	resp, _ = e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}, "gateway_token": {"good-token"}, "next": {"//evil.example/x"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("sign-in: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	cks := resp.Cookies()
	if len(cks) != 1 || cks[0].Name != session.CookieName || strings.Contains(cks[0].Value, "good-token") {
		t.Fatalf("cookie: %v", cks)
	}
	s, err := e.codec.Decode(cks[0].Value)
	if err != nil || s.Tokens.Gateway != "good-token" || s.Open {
		t.Fatalf("session %+v %v", s, err)
	}
}

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/agents": "/agents", "/bus?pattern=a": "/bus?pattern=a", "": "/", "//evil": "/", "http://evil": "/",
		"/\\evil": "/", "/signin": "/", "/x\r\nSet-Cookie: a": "/",
		"/\t/evil.example": "/", "/\x00/evil.example": "/", "/\x7f/evil": "/", "/\x1b/evil": "/", "\t//evil": "/",
		"/%2F/evil.example": "/", "/%2f%2fevil": "/", "https:/evil": "/", "javascript:alert(1)": "/",
		"/runner/instances/a-b?done=launched": "/runner/instances/a-b?done=launched", "/bus#dlq": "/bus#dlq",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every session the runner accepts sees the runner's instances (its
// tokens are not scoped to instances), a page at a time; a refused one sees
// none. Only a session the Librarian accepts as a reviewer sees its
// decisions, as the Librarian lists them, or, from a Librarian that does
// not list them, those made from the console.
func TestSessionsSeeWhatTheServicesAllow(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	a := e.codec.New(session.Tokens{Runner: "ra", Reviewer: "reviewer"}, false)
	b := e.codec.New(session.Tokens{Runner: "rb", Bus: "bus"}, false)
	bad := e.codec.New(session.Tokens{Runner: "bad", Reviewer: "bad"}, false)
	old := e.codec.New(session.Tokens{Reviewer: "old"}, false)
	cka, ckb, ckbad, ckold := e.cookie(t, a), e.cookie(t, b), e.cookie(t, bad), e.cookie(t, old)

	for _, path := range []string{"/runner", "/"} {
		for name, ck := range map[string]*http.Cookie{"a": cka, "b": ckb} {
			if _, body := e.do(t, "GET", path, ck, nil, nil); !strings.Contains(body, `href="/runner/instances/inst-listed"`) {
				t.Errorf("%s's %s does not list the runner's instance:\n%s", name, path, body)
			}
		}
		if _, body := e.do(t, "GET", path, ckbad, nil, nil); strings.Contains(body, "inst-listed") || !strings.Contains(body, `data-banner="runner"`) {
			t.Errorf("a refused session's %s lists the runner's instance:\n%s", path, body)
		}
	}
	_, body := e.do(t, "GET", "/runner", cka, nil, nil)
	if !strings.Contains(body, `href="/runner?page=tok-2"`) || strings.Contains(body, "inst-older") {
		t.Errorf("the first page:\n%s", body)
	}
	_, body = e.do(t, "GET", "/runner?page=tok-2", cka, nil, nil)
	if !strings.Contains(body, "inst-older") || strings.Contains(body, "inst-listed") || strings.Contains(body, "instances-next") || !strings.Contains(body, `id="instances-first"`) {
		t.Errorf("the second page:\n%s", body)
	}
	if resp, _ := e.do(t, "GET", "/runner?page="+strings.Repeat("A", maxPageToken+1), cka, nil, nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("an oversized page token: %d", resp.StatusCode)
	}

	e.h.recordOwnDecision(decision{RequestID: "req-secret", Outcome: "approved", Source: "console", Comment: "private", At: timeNow()})
	if _, body := e.do(t, "GET", "/librarian", cka, nil, nil); !strings.Contains(body, "req-listed") || !strings.Contains(body, "reviewer (alice)") ||
		!strings.Contains(body, "as the Librarian lists them") || strings.Contains(body, "req-secret") {
		t.Errorf("the reviewer does not see the Librarian's decisions:\n%s", body)
	}
	if _, body := e.do(t, "GET", "/librarian", ckbad, nil, nil); strings.Contains(body, "req-listed") || strings.Contains(body, "req-secret") || strings.Contains(body, "private") {
		t.Errorf("a session whose reviewer token is refused sees decisions:\n%s", body)
	}
	if _, body := e.do(t, "GET", "/librarian", ckold, nil, nil); !strings.Contains(body, "req-secret") || !strings.Contains(body, "did not list its decisions") {
		t.Errorf("with a Librarian that does not list decisions, the console's own are not shown:\n%s", body)
	}
}

// Login CSRF: another site cannot sign a browser in with its own tokens.
func TestSignInNeedsItsFormsToken(t *testing.T) {
	t.Parallel()
	svc := services(t)
	for _, open := range []bool{false, true} {
		e := newConsole(t, open, svc.URL, svc.URL, svc.URL, svc.URL)
		ck, tok := e.signinForm(t)
		other := &http.Cookie{Name: session.SignInCookieName, Value: strings.Repeat("A", 43)}
		good := url.Values{"signin_csrf": {tok}, "gateway_token": {"attacker-token"}}
		for name, c := range map[string]struct {
			ck     *http.Cookie
			form   url.Values
			header map[string]string
		}{
			"no cookie, no field":       {nil, url.Values{"gateway_token": {"attacker-token"}}, nil},
			"no cookie":                 {nil, good, nil},
			"no field":                  {ck, url.Values{"gateway_token": {"attacker-token"}}, nil},
			"another cookie":            {other, good, nil},
			"a field of another length": {ck, url.Values{"signin_csrf": {tok + "x"}, "gateway_token": {"attacker-token"}}, nil},
			"Origin: null":              {ck, good, map[string]string{"Origin": "null"}},
			"another origin":            {ck, good, map[string]string{"Origin": "https://evil.example"}},
		} {
			resp, body := e.do(t, "POST", "/signin", c.ck, c.form, c.header)
			if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
				t.Errorf("open=%v, %s: %d %v %s", open, name, resp.StatusCode, resp.Cookies(), body)
			}
		}
		resp, _ := e.do(t, "POST", "/signin", ck, good, map[string]string{"Origin": e.srv.URL})
		if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
			t.Errorf("open=%v, the console's own form: %d %v", open, resp.StatusCode, resp.Cookies())
		}
		if open {
			// conclave dev: continuing without any token still works.
			resp, _ := e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}}, map[string]string{"Origin": e.srv.URL})
			if resp.StatusCode != http.StatusSeeOther {
				t.Errorf("open, continue without a token: %d", resp.StatusCode)
			}
		}
	}
}
