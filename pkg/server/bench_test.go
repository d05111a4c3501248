package server

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// nopResponseWriter keeps the writer's own cost out of the comparison.
type nopResponseWriter struct{ h http.Header }

func (w *nopResponseWriter) Header() http.Header         { return w.h }
func (w *nopResponseWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopResponseWriter) WriteHeader(int)             {}

// BenchmarkHTTPMiddleware compares a trivial handler called directly with the
// same handler reached through the server's full HTTP stack: routing, panic
// recovery, body limit, access-log check and request timeout.
func BenchmarkHTTPMiddleware(b *testing.B) {
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("hello"))
	})
	s, err := New(Config{Name: "bench", HTTPAddr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	s.Handle("GET /hello", hello)

	for _, bb := range []struct {
		name    string
		handler http.Handler
	}{
		{"bare", hello},
		{"server", s.httpServer.Handler},
	} {
		b.Run(bb.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/hello", nil)
			w := &nopResponseWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				bb.handler.ServeHTTP(w, req)
			}
		})
	}
}
