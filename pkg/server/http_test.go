package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func wantJSONError(t *testing.T, res httpResult, code int) {
	t.Helper()
	if res.err != nil || res.status != code {
		t.Fatalf("response = %d %q, %v; want %d", res.status, res.body, res.err, code)
	}
	var body errorResponse
	if err := json.Unmarshal([]byte(res.body), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", res.body, err)
	}
	if body.Error.Code != code || body.Error.Message == "" {
		t.Errorf("body = %q, want {\"error\":{\"code\":%d,\"message\":...}}", res.body, code)
	}
}

func TestHTTPPanicRecovery(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("GET /panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic("handler boom")
		}))
		s.Handle("GET /panic-after-write", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "partial")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
			panic("late boom")
		}))
		s.HandleStream("GET /stream-panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			panic("stream boom")
		}))
	})

	tests := []struct {
		name      string
		path      string
		wantPanic string
		check     func(t *testing.T, res httpResult)
	}{
		{"before writing", "/panic", "handler boom", func(t *testing.T, res httpResult) {
			wantJSONError(t, res, http.StatusInternalServerError)
		}},
		{"streaming route", "/stream-panic", "stream boom", func(t *testing.T, res httpResult) {
			wantJSONError(t, res, http.StatusInternalServerError)
		}},
		{"after headers were sent", "/panic-after-write", "late boom", func(t *testing.T, res httpResult) {
			// The status line is out; the only honest signal left is an
			// aborted body, never a response that looks complete.
			if res.status != http.StatusOK || res.err == nil {
				t.Errorf("response = %d %q, %v; want 200 with a truncated body", res.status, res.body, res.err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.check(t, get(t, ts.url(tt.path)))
			if !strings.Contains(ts.logs.String(), tt.wantPanic) || !strings.Contains(ts.logs.String(), "runtime/debug.Stack") {
				t.Errorf("panic %q not logged with a stack; logs:\n%s", tt.wantPanic, ts.logs)
			}
			if res := get(t, ts.url("/healthz")); res.status != http.StatusOK {
				t.Errorf("server stopped serving after a panic: %d, %v", res.status, res.err)
			}
		})
	}
}

func TestHTTPBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 1024
	// readAll gives up silently on a read error, the way many handlers do;
	// the server must still answer 413.
	readAll := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		_, _ = w.Write(b)
	})
	big := strings.Repeat("x", 2*limit)
	tests := []struct {
		name   string
		limit  int64
		body   string
		hideCL bool // send chunked, so only reading the body reveals its size
		want   int
	}{
		{"within limit", limit, "small", false, http.StatusOK},
		{"declared too large", limit, big, false, http.StatusRequestEntityTooLarge},
		{"chunked too large", limit, big, true, http.StatusRequestEntityTooLarge},
		{"limit disabled", -1, big, true, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0", MaxRequestBodyBytes: tt.limit}, func(s *Server) {
				s.Handle("POST /echo", readAll)
			})
			var body io.Reader = strings.NewReader(tt.body)
			if tt.hideCL {
				body = io.MultiReader(body) // hides the length from net/http
			}
			resp, err := http.Post(ts.url("/echo"), "application/json", body)
			if err != nil {
				t.Fatal(err)
			}
			res := readResponse(resp)
			if tt.want != http.StatusOK {
				wantJSONError(t, res, tt.want)
				return
			}
			if res.status != http.StatusOK || res.body != tt.body {
				t.Errorf("response = %d %.40q, %v; want 200 echoing the body", res.status, res.body, res.err)
			}
		})
	}
}

// TestHTTPErrorWriter: with WithHTTPErrorWriter, the errors the server
// answers itself (a body over the limit, declared or found by reading, and
// a recovered panic) come in the service's own body.
func TestHTTPErrorWriter(t *testing.T) {
	t.Parallel()
	custom := func(w http.ResponseWriter, code int, message string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{"custom_status": code, "text": message})
	}
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0", MaxRequestBodyBytes: 1024}, func(s *Server) {
		s.Handle("POST /read", http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { _, _ = io.ReadAll(r.Body) }))
		s.Handle("GET /panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	}, WithHTTPErrorWriter(custom))
	big := strings.Repeat("x", 2048)
	post := func(body io.Reader) httpResult {
		resp, err := http.Post(ts.url("/read"), "application/json", body)
		if err != nil {
			return httpResult{err: err}
		}
		return readResponse(resp)
	}
	for _, tt := range []struct {
		name string
		res  func() httpResult
		want int
	}{
		{"declared too large", func() httpResult { return post(strings.NewReader(big)) }, http.StatusRequestEntityTooLarge},
		{"chunked too large", func() httpResult { return post(io.MultiReader(strings.NewReader(big))) }, http.StatusRequestEntityTooLarge},
		{"panic", func() httpResult { return get(t, ts.url("/panic")) }, http.StatusInternalServerError},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := tt.res()
			var body struct {
				CustomStatus int    `json:"custom_status"`
				Text         string `json:"text"`
			}
			if res.err != nil || res.status != tt.want || json.Unmarshal([]byte(res.body), &body) != nil || body.CustomStatus != tt.want || body.Text == "" {
				t.Fatalf("response = %d %q, %v; want %d in the custom body", res.status, res.body, res.err, tt.want)
			}
		})
	}
}

func TestHTTPRequestTimeoutOnlyOnUnaryRoutes(t *testing.T) {
	t.Parallel()
	hasDeadline := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := r.Context().Deadline()
		_ = json.NewEncoder(w).Encode(ok)
	})
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("GET /unary", hasDeadline)
		s.HandleStream("GET /stream", hasDeadline)
	})
	tests := []struct {
		path string
		want string
	}{
		{"/unary", "true\n"},
		{"/stream", "false\n"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			if res := get(t, ts.url(tt.path)); res.body != tt.want {
				t.Errorf("GET %s: handler saw deadline = %q, want %q", tt.path, res.body, tt.want)
			}
		})
	}
}

func TestStreamingRouteOutlivesWriteTimeout(t *testing.T) {
	t.Parallel()
	const writeTimeout = 50 * time.Millisecond
	// The handler pauses past WriteTimeout between two events. Only a route
	// whose write deadline was cleared can deliver the second one.
	events := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: first\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
		time.Sleep(3 * writeTimeout)
		_, _ = io.WriteString(w, "data: second\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
	})
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0", WriteTimeout: writeTimeout}, func(s *Server) {
		s.HandleStream("GET /stream", events)
		s.Handle("GET /unary", events)
	})
	tests := []struct {
		path         string
		wantComplete bool
	}{
		{"/stream", true},
		// The control case: proves the pause really outlasts the deadline.
		{"/unary", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			res := get(t, ts.url(tt.path))
			complete := res.err == nil && res.body == "data: first\n\ndata: second\n\n"
			if complete != tt.wantComplete {
				t.Errorf("GET %s = %q, %v; complete = %v, want %v", tt.path, res.body, res.err, complete, tt.wantComplete)
			}
		})
	}
}

func TestHTTPMiddlewareWrapsEverything(t *testing.T) {
	t.Parallel()
	var order []string
	statuses := make(chan int, 1)
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec := &statusRecorder{ResponseWriter: w}
			order = append(order, "outer")
			next.ServeHTTP(rec, r)
			statuses <- rec.status
		})
	}
	inner := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			order = append(order, "inner")
			next.ServeHTTP(w, r)
		})
	}
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("GET /panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	}, WithHTTPMiddleware(outer), WithHTTPMiddleware(inner))

	get(t, ts.url("/panic"))
	// Middleware sees the 500 that recovery produced: tracing records it.
	if got := <-statuses; got != http.StatusInternalServerError {
		t.Errorf("middleware saw status %d, want 500", got)
	}
	if strings.Join(order, ",") != "outer,inner" {
		t.Errorf("middleware order = %v, want outer,inner", order)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("POST /decode", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var v map[string]any
			if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
				WriteError(w, http.StatusBadRequest, "want a JSON object")
			}
		}))
	})
	resp, err := http.Post(ts.url("/decode"), "application/json", bytes.NewReader([]byte("[")))
	if err != nil {
		t.Fatal(err)
	}
	res := readResponse(resp)
	wantJSONError(t, res, http.StatusBadRequest)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
}
