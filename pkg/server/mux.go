package server

import (
	"net/http"
)

// routes serves the mux, answering the requests it has no route for (404,
// and 405 with its Allow header) through the service's error writer:
// net/http's ServeMux would answer them in plain text, and every error of
// a service is in that service's one shape.
func (s *Server) routes() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := s.mux.Handler(r); pattern != "" || r.RequestURI == "*" {
			s.mux.ServeHTTP(w, r)
			return
		}
		// No pattern: the mux answers 404 or 405, or redirects to the
		// cleaned path, which passes through.
		nr := &noRoute{ResponseWriter: w}
		s.mux.ServeHTTP(nr, r)
		switch nr.code {
		case http.StatusNotFound:
			s.writeError(w, nr.code, "not found: no endpoint has this path")
		case http.StatusMethodNotAllowed:
			s.writeError(w, nr.code, "method not allowed: this endpoint takes "+w.Header().Get("Allow"))
		}
	})
}

// noRoute swallows the mux's plain-text 404 and 405, keeping the headers
// it sets (Allow) for the error writer, and passes anything else through.
type noRoute struct {
	http.ResponseWriter
	code int // 404 or 405 once swallowed
}

func (w *noRoute) WriteHeader(code int) {
	if code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
		w.code = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *noRoute) Write(p []byte) (int, error) {
	if w.code != 0 {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}
