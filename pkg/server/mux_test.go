package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"context"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestNoRouteUsesErrorWriter: what the mux has no route for is answered
// through the service's error writer, 405 with its Allow header, not in
// net/http's plain text; a redirect to the cleaned path passes through.
func TestNoRouteUsesErrorWriter(t *testing.T) {
	t.Parallel()
	custom := func(w http.ResponseWriter, code int, message string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{"custom_status": code, "text": message})
	}
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("GET /things/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(r.PathValue("id"))) }))
	}, WithHTTPErrorWriter(custom))
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tt := range []struct {
		name, method, path string
		want               int
		allow              string
	}{
		{"unknown path", "GET", "/nope", http.StatusNotFound, ""},
		{"long unknown path", "GET", "/" + strings.Repeat("x", 5000), http.StatusNotFound, ""},
		{"wrong method", "PUT", "/things/a", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"wrong method on a built-in route", "DELETE", "/healthz", http.StatusMethodNotAllowed, "GET, HEAD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, ts.url(tt.path), nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res := readResponse(resp)
			var body struct {
				CustomStatus int    `json:"custom_status"`
				Text         string `json:"text"`
			}
			if res.status != tt.want || json.Unmarshal([]byte(res.body), &body) != nil || body.CustomStatus != tt.want || body.Text == "" {
				t.Fatalf("response = %d %q; want %d in the custom body", res.status, res.body, tt.want)
			}
			if strings.Contains(body.Text, "xxxx") {
				t.Errorf("the message echoes the path: %q", body.Text)
			}
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
		})
	}
	t.Run("routed", func(t *testing.T) {
		if res := get(t, ts.url("/things/a%2Fb")); res.status != http.StatusOK || res.body != "a/b" {
			t.Fatalf("GET /things/a%%2Fb = %d %q", res.status, res.body)
		}
	})
	t.Run("cleaned path redirects", func(t *testing.T) {
		resp, err := client.Get(ts.url("/things/../nope"))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect {
			t.Fatalf("status %d, want 307", resp.StatusCode)
		}
	})
}

// TestHiddenCauseIsLoggedNotSent: the client of a call failing with Hide
// sees only the public status; the log has the cause.
func TestHiddenCauseIsLoggedNotSent(t *testing.T) {
	t.Parallel()
	cause := errors.New("store: key longer than DynamoDB allows: secret-key-123")
	ts := startServer(t, Config{GRPCAddr: "127.0.0.1:0"}, func(s *Server) {
		registerTestService(s, &testService{unary: func(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return nil, Hide(status.New(codes.Unavailable, "the store is unavailable; retry"), cause)
		}})
	})
	_, err := callUnary(t.Context(), ts.dial(t), "hi")
	if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "the store is unavailable; retry" {
		t.Fatalf("client got %v", err)
	}
	if !strings.Contains(ts.logs.String(), "level=ERROR") || !strings.Contains(ts.logs.String(), "secret-key-123") {
		t.Errorf("cause not logged at error level; logs:\n%s", ts.logs)
	}
	if got, ok := HiddenCause(Hide(status.New(codes.Internal, "x"), cause)); !ok || !errors.Is(got, cause) {
		t.Errorf("HiddenCause = %v, %v", got, ok)
	}
}
