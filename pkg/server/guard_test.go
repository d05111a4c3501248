package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// doRequest sends one request with the given headers and body.
func doRequest(t *testing.T, method, url, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestContentTypeRule(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	count := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ran.Add(1) })
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("/json", count)
		s.HandleStream("POST /stream", count)
		s.HandleDrained("POST /drained", count)
		s.Handle("POST /form", AcceptContentTypes(count, "application/x-www-form-urlencoded"))
		s.Handle("POST /own", OwnContentTypes(count))
	})
	tests := []struct {
		name, method, path, body string
		header                   map[string]string
		want                     int
	}{
		{"json post", "POST", "/json", `{}`, map[string]string{"Content-Type": "application/json; charset=utf-8"}, 200},
		{"text/plain post", "POST", "/json", `{}`, map[string]string{"Content-Type": "text/plain"}, 415},
		{"form post to a JSON route", "POST", "/json", `a=b`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"multipart post", "POST", "/json", `x`, map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415},
		{"body without a type (a Blob)", "POST", "/json", `{}`, nil, 415},
		{"empty post without a type", "POST", "/json", "", nil, 415},
		{"empty post with a token", "POST", "/json", "", map[string]string{"Authorization": "Bearer x"}, 200},
		{"empty post declared JSON", "POST", "/json", "", map[string]string{"Content-Type": "application/json"}, 200},
		{"delete without a body", "DELETE", "/json", "", nil, 200},
		{"text/plain delete", "DELETE", "/json", "x", map[string]string{"Content-Type": "text/plain"}, 415},
		{"put without a type, with a body", "PUT", "/json", "x", nil, 415},
		{"malformed type", "POST", "/json", "x", map[string]string{"Content-Type": "application/json; ;;="}, 415},
		{"get", "GET", "/json", "", map[string]string{"Content-Type": "text/plain"}, 200},
		{"text/plain to a stream", "POST", "/stream", "x", map[string]string{"Content-Type": "text/plain"}, 415},
		{"text/plain to a drained route", "POST", "/drained", "x", map[string]string{"Content-Type": "text/plain"}, 415},
		{"form to a form route", "POST", "/form", "a=b", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 200},
		{"JSON to a form route", "POST", "/form", "{}", map[string]string{"Content-Type": "application/json"}, 415},
		{"text/plain to a form route", "POST", "/form", "a=b", map[string]string{"Content-Type": "text/plain"}, 415},
		{"own rule", "POST", "/own", "x", map[string]string{"Content-Type": "text/plain"}, 200},
	}
	for _, tt := range tests {
		before := ran.Load()
		resp, body := doRequest(t, tt.method, ts.url(tt.path), tt.body, tt.header)
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %d %s, want %d", tt.name, resp.StatusCode, body, tt.want)
			continue
		}
		if ranNow := ran.Load() != before; ranNow != (tt.want == 200) {
			t.Errorf("%s: handler ran = %v with status %d", tt.name, ranNow, tt.want)
		}
		if tt.want == 415 && !strings.Contains(body, `"code":415`) {
			t.Errorf("%s: body %s is not the server's error shape", tt.name, body)
		}
	}
}

func TestDevelopmentGuardHosts(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("/x", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) }))
	}, WithDevelopmentGuard([]string{"conclave.test"}),
		WithHTTPErrorWriter(func(w http.ResponseWriter, code int, msg string) {
			w.Header().Set("X-Shape", "service")
			WriteError(w, code, msg)
		}))
	_, port, _ := net.SplitHostPort(ts.HTTPAddr())
	for _, tt := range []struct {
		host string
		want int
	}{
		{"localhost", 200},
		{"localhost:" + port, 200},
		{"LOCALHOST:1", 200},
		{"app.localhost:" + port, 200},
		{"127.0.0.1:" + port, 200},
		{"127.0.0.2", 200},
		{"[::1]:" + port, 200},
		{"[::1]", 200},
		{"conclave.test:8080", 200},
		{"Conclave.Test.", 200},
		{"evil.example", 403},
		{"evil.example:" + port, 403},
		{"localhost.evil.example", 403},
		{"127.0.0.1.nip.io", 403},
		{"10.0.0.1", 403},
		{"[::ffff:10.0.0.1]", 403},
		{":" + port, 403},
	} {
		before := ran.Load()
		resp, body := doRequest(t, "GET", ts.url("/x"), "", map[string]string{"Host": tt.host})
		if resp.StatusCode != tt.want {
			t.Errorf("Host %q: %d %s, want %d", tt.host, resp.StatusCode, body, tt.want)
		}
		if tt.want == 403 && (ran.Load() != before || resp.Header.Get("X-Shape") != "service") {
			t.Errorf("Host %q: the handler ran, or the answer is not in the service's shape", tt.host)
		}
	}
	// The built-in routes are guarded too: a rebinding page reads nothing.
	if resp, _ := doRequest(t, "GET", ts.url("/metrics"), "", map[string]string{"Host": "evil.example"}); resp.StatusCode != 403 {
		t.Errorf("/metrics for evil.example: %d", resp.StatusCode)
	}
}

func TestWithoutDevelopmentGuardAnyHost(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, nil)
	if resp, _ := doRequest(t, "GET", ts.url("/healthz"), "", map[string]string{"Host": "api.example.com"}); resp.StatusCode != 200 {
		t.Errorf("an authenticated server refused a Host: %d", resp.StatusCode)
	}
}

func TestDevelopmentGuardRefusesNetworkBinds(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	for _, cfg := range []Config{
		{HTTPAddr: ":0"},
		{HTTPAddr: "0.0.0.0:0"},
		{HTTPAddr: "[::]:0"},
		{GRPCAddr: ":0", HTTPAddr: "127.0.0.1:0"},
		{GRPCAddr: "0.0.0.0:0"},
	} {
		cfg.Name = "guarded"
		s, err := New(cfg, logger, WithDevelopmentGuard(nil))
		if err != nil {
			t.Fatal(err)
		}
		err = s.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), "without authentication") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: Run = %v, want one line refusing a network bind", cfg, err)
		}
	}
	// A handed-over listener on every interface is refused by its bound
	// address.
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Name: "guarded"}, logger, WithDevelopmentGuard(nil), WithHTTPListener(l))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "without authentication") {
		t.Errorf("handed-over listener on %s: Run = %v", l.Addr(), err)
	}
	// Loopback binds serve.
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		if addr == "[::1]:0" {
			if l, err := net.Listen("tcp", addr); err != nil {
				continue // no IPv6 loopback on this machine
			} else {
				_ = l.Close()
			}
		}
		ts := startServer(t, Config{HTTPAddr: addr}, nil, WithDevelopmentGuard(nil))
		if r := get(t, ts.url("/healthz")); r.status != 200 {
			t.Errorf("%s: /healthz %d %v", addr, r.status, r.err)
		}
	}
}

func TestEvery429HasRetryAfter(t *testing.T) {
	t.Parallel()
	ts := startServer(t, Config{HTTPAddr: "127.0.0.1:0"}, func(s *Server) {
		s.Handle("GET /bare", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTooManyRequests)
		}))
		s.Handle("GET /own", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
		}))
	})
	for path, want := range map[string]string{"/bare": "1", "/own": "7"} {
		resp, _ := doRequest(t, "GET", ts.url(path), "", nil)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != want {
			t.Errorf("%s: %d Retry-After %q, want 429 with %q", path, resp.StatusCode, resp.Header.Get("Retry-After"), want)
		}
	}
}
