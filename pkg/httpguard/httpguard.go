// Package httpguard holds the rules that keep a web page in a user's
// browser from driving a Conclave HTTP API: the content-type rule, which
// refuses the "simple" requests a page may send to any origin without
// asking, and the Host rule, which refuses requests a page sends through
// DNS rebinding to a listener that runs without authentication.
//
// It depends on nothing but the standard library, so that the Librarian's
// Lambda, which runs no pkg/server, applies the same rules.
package httpguard

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// JSON is the media type state-changing requests carry unless their
// protocol names another.
const JSON = "application/json"

// Form is the media type of an HTML form post.
const Form = "application/x-www-form-urlencoded"

// StateChanging reports whether method may change state: every method but
// GET, HEAD, OPTIONS and TRACE.
func StateChanging(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// ContentType applies the content-type rule to r and returns nil, or the
// message of a 415 answer. A state-changing request passes when:
//
//   - its Content-Type's media type is one of allowed (JSON when allowed is
//     empty), whatever its body; or
//   - it has no Content-Type and no body, and either it is not a POST or it
//     carries an Authorization header.
//
// Why the second case is narrow: a page may send any other origin a POST
// without a Content-Type (fetch with no body, or with a Blob or an
// ArrayBuffer body, which has none) without a CORS preflight, but not a
// PUT, PATCH or DELETE, nor any request with an Authorization header. So a
// body-less POST of a program is accepted when it authenticates, and in
// development, where nothing authenticates, it must say
// "Content-Type: application/json".
func ContentType(r *http.Request, allowed ...string) error {
	if !StateChanging(r.Method) {
		return nil
	}
	if len(allowed) == 0 {
		allowed = []string{JSON}
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		if !hasBody(r) && (r.Method != http.MethodPost || r.Header.Get("Authorization") != "") {
			return nil
		}
		return fmt.Errorf("a %s needs Content-Type: %s", r.Method, strings.Join(allowed, " or "))
	}
	mediaType, _, err := mime.ParseMediaType(ct)
	if err == nil {
		for _, a := range allowed {
			if strings.EqualFold(mediaType, a) {
				return nil
			}
		}
	}
	return fmt.Errorf("Content-Type %q is not accepted; send %s", clip(ct), strings.Join(allowed, " or "))
}

// hasBody reports whether r carries a body: a positive Content-Length, or
// one of unknown length (chunked).
func hasBody(r *http.Request) bool {
	return r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Hosts decides which Host headers a listener without authentication
// answers: loopback names (localhost, any name under .localhost, any
// loopback IP), with any port, and the names an operator lists.
type Hosts struct {
	extra map[string]bool
}

// NewHosts returns the rule for loopback names plus allowed (host names or
// IPs, without port, compared without regard to case).
func NewHosts(allowed []string) *Hosts {
	h := &Hosts{extra: map[string]bool{}}
	for _, a := range allowed {
		if a = strings.TrimSpace(a); a != "" {
			h.extra[strings.ToLower(strings.TrimSuffix(strings.Trim(a, "[]"), "."))] = true
		}
	}
	return h
}

// Allowed reports whether host (a Host header: a name or IP, with or
// without a port) names this listener.
func (h *Hosts) Allowed(host string) bool {
	name := HostName(host)
	if name == "" {
		return false
	}
	return LoopbackName(name) || h.extra[name]
}

// HostName is the name of a Host header without its port, lower case,
// brackets and a trailing dot removed; "" when the header is empty or
// malformed.
func HostName(host string) string {
	if host == "" {
		return ""
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		name = host[1 : len(host)-1]
	} else if strings.Count(host, ":") == 1 {
		return "" // a port without a host, or worse
	}
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// LoopbackName reports whether name (without a port) is localhost, a name
// under .localhost (RFC 6761 keeps them on loopback), or a loopback IP.
func LoopbackName(name string) bool {
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(name)
	return err == nil && ip.Unmap().IsLoopback()
}

// LoopbackAddr reports whether a listen address (host:port) binds loopback
// only: its host is a loopback IP or localhost. An empty host (":8080") or
// an unspecified one (0.0.0.0, ::) binds every interface.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// CheckListen is the configuration check of a listener that runs without
// authentication: nil when addr (the setting env) is empty or binds
// loopback only, else an error naming env and the setting, allowing, that
// makes it unauthenticated.
func CheckListen(env, addr, allowing string) error {
	if addr == "" || LoopbackAddr(addr) {
		return nil
	}
	return fmt.Errorf("%s: %q listens beyond loopback, and %s=true serves it without authentication; bind 127.0.0.1, [::1] or localhost, or configure tokens", env, addr, allowing)
}
