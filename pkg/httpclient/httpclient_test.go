package httpclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestDo: what the client sends, and how it reads each answer, against a
// server that answers a fixed status and body.
func TestDo(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		method      string
		body        any
		token       string
		maxResponse int64
		status      int
		answer      string
		wantBody    string // the request body the server sees
		wantCT      bool   // Content-Type: application/json sent
		want        string // the answer Do returns
		wantErr     *Error // nil for success
		wantErrText string // a part of the error's text
	}{
		{name: "a GET with a token", method: "GET", token: "tok", status: 200, answer: `{"ok":true}`, want: `{"ok":true}`},
		{name: "a POST of a value", method: "POST", body: map[string]string{"a": "b"}, status: 200, answer: `{}`,
			wantBody: `{"a":"b"}`, wantCT: true, want: `{}`},
		{name: "a POST of raw bytes", method: "POST", body: []byte(`{"raw":1}`), status: 200, answer: `{}`,
			wantBody: `{"raw":1}`, wantCT: true, want: `{}`},
		{name: "a POST without a body still declares JSON", method: "POST", status: 200, answer: `{}`, wantCT: true, want: `{}`},
		{name: "the runner's shape", method: "GET", status: 400,
			answer:      `{"error":"validation_error","message":"bad page token","details":"page_token","http_status":400}`,
			wantErr:     &Error{StatusCode: 400, Code: "validation_error", Message: "bad page token", Details: "page_token"},
			wantErrText: "GET /x: 400 validation_error: bad page token (page_token)"},
		{name: "the Librarian's shape", method: "POST", status: 400,
			answer:      `{"error":{"code":400,"status":"missing_agent_id","message":"agent_id is required","field":"agent_id"}}`,
			wantCT:      true,
			wantErr:     &Error{StatusCode: 400, Code: "missing_agent_id", Message: "agent_id is required", Field: "agent_id"},
			wantErrText: "POST /x: 400 missing_agent_id: agent_id is required (field agent_id)"},
		{name: "pkg/server's shape (bus, console)", method: "GET", status: 404,
			answer:      `{"error":{"code":404,"message":"bus: dead letter not found: x"}}`,
			wantErr:     &Error{StatusCode: 404, Message: "bus: dead letter not found: x"},
			wantErrText: "GET /x: 404 Not Found: bus: dead letter not found: x"},
		{name: "MCP's JSON-RPC error", method: "POST", status: 404,
			answer:      `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"session not found"}}`,
			wantCT:      true,
			wantErr:     &Error{StatusCode: 404, Code: "JSON-RPC -32600", Message: "session not found"},
			wantErrText: "404 JSON-RPC -32600: session not found"},
		{name: "the gateway's google.rpc.Status", method: "GET", status: 404,
			answer:      `{"code":5,"message":"agent \"a\" is not connected","details":[]}`,
			wantErr:     &Error{StatusCode: 404, Code: "NotFound", Message: `agent "a" is not connected`},
			wantErrText: `404 NotFound: agent "a" is not connected`},
		{name: "not JSON", method: "GET", status: 502, answer: "bad gateway\n",
			wantErr:     &Error{StatusCode: 502, Message: "bad gateway"},
			wantErrText: "GET /x: 502 Bad Gateway: bad gateway"},
		{name: "a long page is cut", method: "GET", status: 500, answer: "<html>" + strings.Repeat("é", 1000),
			wantErrText: "…"},
		{name: "an answer over the limit", method: "GET", maxResponse: 10, status: 200, answer: strings.Repeat("x", 11),
			wantErrText: "larger than the client's limit"},
		{name: "an answer at the limit", method: "GET", maxResponse: 10, status: 200, answer: strings.Repeat("x", 10),
			want: strings.Repeat("x", 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var gotBody, gotAuth, gotCT, gotPath, gotMethod string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				gotBody, gotAuth, gotCT, gotPath, gotMethod = string(b), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.URL.Path, r.Method
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.answer)
			}))
			defer srv.Close()
			c := New(srv.URL+"/", tt.token)
			c.MaxResponse = tt.maxResponse
			got, err := c.Do(t.Context(), tt.method, "/x", tt.body)
			if gotMethod != tt.method || gotPath != "/x" || gotBody != tt.wantBody {
				t.Errorf("the server got %s %s %q, want %s /x %q", gotMethod, gotPath, gotBody, tt.method, tt.wantBody)
			}
			if want := map[bool]string{true: "Bearer " + tt.token, false: ""}[tt.token != ""]; gotAuth != want {
				t.Errorf("Authorization %q, want %q", gotAuth, want)
			}
			if (gotCT == "application/json") != tt.wantCT {
				t.Errorf("Content-Type %q, want JSON declared: %v", gotCT, tt.wantCT)
			}
			if tt.wantErrText == "" {
				if err != nil || string(got) != tt.want {
					t.Fatalf("Do: %q %v, want %q", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErrText) {
				t.Fatalf("Do: error %v, want one saying %q", err, tt.wantErrText)
			}
			if tt.wantErr == nil {
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Do: error %T, want *Error", err)
			}
			tt.wantErr.Method, tt.wantErr.Path = tt.method, "/x"
			gotErr := *e
			gotErr.Header = nil // TestSend checks it
			if !reflect.DeepEqual(gotErr, *tt.wantErr) {
				t.Fatalf("Do: error %#v, want %#v", gotErr, *tt.wantErr)
			}
		})
	}
}

// TestSend: a Request's token replaces the client's, its headers are
// sent, and an error answer's headers come back on the *Error.
func TestSend(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, clientToken, token, wantAuth string
	}{
		{"the request's token", "client", "caller", "Bearer caller"},
		{"the client's token", "client", "", "Bearer client"},
		{"no token", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.Header.Get("Authorization"); got != tt.wantAuth {
					t.Errorf("Authorization %q, want %q", got, tt.wantAuth)
				}
				if got := r.Header.Get("Idempotency-Key"); got != "k1" {
					t.Errorf("Idempotency-Key %q, want k1", got)
				}
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			defer srv.Close()
			_, err := New(srv.URL, tt.clientToken).Send(t.Context(), Request{Method: "POST", Path: "/x", Body: []byte(`{}`),
				Token: tt.token, Header: http.Header{"idempotency-key": {"k1"}}})
			var e *Error
			if !errors.As(err, &e) || e.StatusCode != http.StatusServiceUnavailable || e.Header.Get("Retry-After") != "7" {
				t.Fatalf("Send: error %#v, want a 503 with Retry-After 7", err)
			}
		})
	}
}

// TestJSON: JSON decodes a good answer, and says so when the answer is not
// the JSON expected.
func TestJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, answer string
		want         int
		wantErr      string
	}{
		{"a document", `{"n":3}`, 3, ""},
		{"not JSON", `<html>`, 0, "not the JSON expected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, tt.answer) }))
			defer srv.Close()
			var out struct{ N int }
			err := New(srv.URL, "").JSON(t.Context(), "GET", "/", nil, &out)
			switch {
			case tt.wantErr == "" && (err != nil || out.N != tt.want):
				t.Fatalf("JSON: %+v %v, want n=%d", out, err, tt.want)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("JSON: error %v, want one saying %q", err, tt.wantErr)
			}
		})
	}
}

// TestTimeouts: Do gives up on a server that does not answer in time;
// Stream gives up on one that sends no headers, but not on a stream that
// lasts longer than the timeout.
func TestTimeouts(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/silent":
			select {
			case <-r.Context().Done():
			case <-release:
			}
		case "/stream":
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(200)
			rc := http.NewResponseController(w)
			if err := rc.Flush(); err != nil {
				t.Errorf("flush: %v", err)
				return
			}
			for i := range 3 {
				// Each line waits past the client's timeout.
				time.Sleep(150 * time.Millisecond)
				json.NewEncoder(w).Encode(map[string]int{"n": i})
				rc.Flush()
			}
		}
	}))
	defer srv.Close()
	defer close(release)
	c := New(srv.URL, "")
	c.Timeout = 100 * time.Millisecond

	if _, err := c.Do(t.Context(), "GET", "/silent", nil); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do of a silent server: %v, want a deadline", err)
	}
	if _, err := c.Stream(t.Context(), "GET", "/silent", nil); err == nil || !strings.Contains(err.Error(), "no answer within") {
		t.Errorf("Stream of a silent server: %v, want no answer within the timeout", err)
	}
	body, err := c.Stream(t.Context(), "GET", "/stream", nil)
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer body.Close()
	var lines []string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil || len(lines) != 3 {
		t.Fatalf("the stream: %q %v, want its 3 lines", lines, err)
	}
}

// TestStreamError: a stream refused is the service's error, as for Do.
func TestStreamError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":"not_found","message":"instance x not found","details":"","http_status":404}`)
	}))
	defer srv.Close()
	_, err := New(srv.URL, "").Stream(t.Context(), "GET", "/logs", nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != "not_found" || e.StatusCode != 404 {
		t.Fatalf("Stream: %v, want the runner's not_found", err)
	}
}
