package server

import (
	"fmt"
	"net"
	"net/http"

	"github.com/conclave-ai/conclave/pkg/httpguard"
)

// WithDevelopmentGuard is for a server that runs without authentication
// (development): Run refuses to listen anywhere but loopback, and the HTTP
// listener answers only requests whose Host names loopback (localhost,
// 127.0.0.1, [::1], any port) or one of allowedHosts, and refuses the
// others with 403, so that a page in the developer's browser cannot reach
// it through DNS rebinding. The gRPC listener has no such check: a browser
// cannot speak gRPC, and the loopback bind is its guard.
func WithDevelopmentGuard(allowedHosts []string) Option {
	return func(o *options) { o.devHosts = httpguard.NewHosts(allowedHosts) }
}

// AcceptContentTypes registers h as a route whose state-changing requests
// carry one of mediaTypes (its protocol's own, e.g. an HTML form's
// application/x-www-form-urlencoded) instead of application/json. Every
// other route takes application/json alone: see httpguard.ContentType.
func AcceptContentTypes(h http.Handler, mediaTypes ...string) http.Handler {
	return contentTypeRoute{Handler: h, types: mediaTypes}
}

// OwnContentTypes registers h as a route that applies the content-type rule
// itself, per path (the Librarian's handler, which the Lambda serves
// without this package).
func OwnContentTypes(h http.Handler) http.Handler {
	return contentTypeRoute{Handler: h, own: true}
}

type contentTypeRoute struct {
	http.Handler
	types []string
	own   bool
}

// checkContentType wraps a route in the content-type rule: a
// state-changing request in any other type is answered with 415 before
// the handler runs. It costs nothing in production and keeps a page that
// shares a cookie or a network with the API from posting to it.
func (s *Server) checkContentType(h http.Handler) http.Handler {
	route, ok := h.(contentTypeRoute)
	if ok && route.own {
		return route.Handler
	}
	var types []string
	if ok {
		h, types = route.Handler, route.types
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := httpguard.ContentType(r, types...); err != nil {
			s.writeError(w, http.StatusUnsupportedMediaType, err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostAllowed applies the development guard's Host rule; it has answered
// the request when it returns false.
func (s *Server) hostAllowed(w http.ResponseWriter, r *http.Request) bool {
	if s.devHosts == nil || s.devHosts.Allowed(r.Host) {
		return true
	}
	s.writeError(w, http.StatusForbidden, fmt.Sprintf(
		"Host %q is not this server's: without authentication it answers only localhost, 127.0.0.1 and [::1] (or the names its operator allows)", clipHost(r.Host)))
	return false
}

func clipHost(h string) string {
	if len(h) > 64 {
		return h[:64] + "…"
	}
	return h
}

// checkLoopback refuses, under the development guard, a listen address
// that is not loopback: before binding, the configured one (so ":8080" and
// "0.0.0.0:8080" fail without binding), and after, the bound one (so a
// handed-over listener or a name that resolves elsewhere fails too).
func (s *Server) checkLoopback(kind, addr string) error {
	if s.devHosts == nil || addr == "" || httpguard.LoopbackAddr(addr) {
		return nil
	}
	return fmt.Errorf("server %s: refusing to serve %s on %s without authentication: bind loopback (127.0.0.1, [::1] or localhost) or configure tokens",
		s.cfg.Name, kind, addr)
}

// checkBound checks the addresses of the bound listeners.
func (s *Server) checkBound() error {
	for _, l := range []struct {
		kind string
		l    net.Listener
	}{{"gRPC", s.grpcListener}, {"HTTP", s.httpListener}} {
		if l.l != nil {
			if err := s.checkLoopback(l.kind, l.l.Addr().String()); err != nil {
				return err
			}
		}
	}
	return nil
}
