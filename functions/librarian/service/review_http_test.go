package service_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
)

// TestReviewPageGuards: without a session the pages send a reviewer to
// sign in; a form without the session's CSRF token is refused and changes
// nothing; an agent token never becomes a session; a redirect target
// outside the review pages is ignored.
func TestReviewPageGuards(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	req := librarianApproval()
	req["risk_assessment"] = "critical"
	id := e.do(t, "POST", "/agent/request", claudeToken, req).response(t).RequestId

	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(e.srv.URL + "/review/" + id)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/review/signin?next=") {
		t.Fatalf("unsigned page: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A forged form from another site, without a session: sign in first.
	resp, err = noFollow.PostForm(e.srv.URL+"/review/"+id, url.Values{"decision": {"approve"}, "comment": {"x"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("forged form without a session: %d", resp.StatusCode)
	}
	// An agent token is not a session.
	resp, err = noFollow.PostForm(e.srv.URL+"/review/signin", url.Values{"token": {claudeToken}, "next": {"/review"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("agent sign-in: %d %v", resp.StatusCode, resp.Cookies())
	}
	// A reviewer signs in; next pointing elsewhere is ignored.
	jar, _ := cookiejar.New(nil)
	signed := &http.Client{Jar: jar, CheckRedirect: noFollow.CheckRedirect}
	resp, err = signed.PostForm(e.srv.URL+"/review/signin", url.Values{"token": {reviewerToken}, "next": {"//evil.example.com/"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/review" || len(cookies) != 1 ||
		!cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("reviewer sign-in: %d %s %v", resp.StatusCode, resp.Header.Get("Location"), cookies)
	}
	// Signed in, but the form lacks the CSRF token: refused.
	for _, csrf := range []string{"", strings.Repeat("0", 64)} {
		resp, err = signed.PostForm(e.srv.URL+"/review/"+id, url.Values{"decision": {"approve"}, "comment": {"x"}, "csrf": {csrf}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("csrf %q: %d", csrf, resp.StatusCode)
		}
	}
	if st := e.do(t, "GET", "/agent/status/"+id, claudeToken, nil); !strings.Contains(string(st.body), `"status":"escalated"`) {
		t.Fatalf("a refused form changed the request: %s", st.body)
	}
	// The list page shows the request to the signed-in reviewer.
	resp, err = signed.Get(e.srv.URL + "/review")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(b.String(), id) || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("list: %d %s", resp.StatusCode, b.String())
	}
}
