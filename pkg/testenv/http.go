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
