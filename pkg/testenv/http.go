package testenv

import (
	"io"
	"net/http"
	"testing"
)

// Do sends req with the default client and returns the response with its
// whole body, already closed, failing t when the request cannot be sent or
// its body read. The default client has no timeout of its own: give req a
// context with a deadline where the server might not answer.
func Do(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", req.Method, req.URL, err)
	}
	return resp, body
}

// Bearer is an http.RoundTripper that adds an Authorization: Bearer header
// with Token to every request it passes to Next, and none when Token is
// empty (a development server that needs none).
type Bearer struct {
	Token string
	Next  http.RoundTripper
}

// RoundTrip implements http.RoundTripper on a copy of r, which it must not
// change.
func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.Token == "" {
		return b.Next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.Token)
	return b.Next.RoundTrip(r)
}
