package httpguard_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/httpguard"
)

func TestHostsAllowed(t *testing.T) {
	t.Parallel()
	h := httpguard.NewHosts([]string{" dev.example ", "[fd00::1]", ""})
	for host, want := range map[string]bool{
		"localhost":           true,
		"localhost:8080":      true,
		"LocalHost.:8080":     true,
		"api.localhost:1":     true,
		"127.0.0.1":           true,
		"127.1.2.3:80":        true,
		"[::1]:8080":          true,
		"[::1]":               true,
		"::1":                 true,
		"[::ffff:127.0.0.1]":  true,
		"dev.example:443":     true,
		"DEV.EXAMPLE":         true,
		"[fd00::1]:80":        true,
		"":                    false,
		"evil.example":        false,
		"localhost.evil.com":  false,
		"evillocalhost":       false,
		"0.0.0.0:8080":        false,
		"192.168.1.10":        false,
		"[fe80::1%25eth0]:80": false,
		":8080":               false,
		"[":                   false,
		"example.com:80:80":   false,
	} {
		if got := h.Allowed(host); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestLoopbackAddr(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true,
		"localhost:0":    true,
		"[::1]:0":        true,
		"127.0.0.2:1":    true,
		":8080":          false,
		"0.0.0.0:8080":   false,
		"[::]:8080":      false,
		"10.1.2.3:8080":  false,
		"example.com:80": false,
		"127.0.0.1":      false, // not host:port
		"":               false,
	} {
		if got := httpguard.LoopbackAddr(addr); got != want {
			t.Errorf("LoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestContentType(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method, body, ct, authz string
		allowed                       []string
		ok                            bool
	}{
		{"json", "POST", "{}", "application/json", "", nil, true},
		{"json with charset", "POST", "{}", "Application/JSON; charset=utf-8", "", nil, true},
		{"text/plain", "POST", "{}", "text/plain", "", nil, false},
		{"form", "POST", "a=b", "application/x-www-form-urlencoded", "", nil, false},
		{"form allowed", "POST", "a=b", "application/x-www-form-urlencoded", "", []string{httpguard.Form}, true},
		{"json where only forms are", "POST", "{}", "application/json", "", []string{httpguard.Form}, false},
		{"untyped body", "POST", "{}", "", "", nil, false},
		{"untyped empty post", "POST", "", "", "", nil, false},
		{"untyped empty post with a token", "POST", "", "", "Bearer t", nil, true},
		{"untyped empty delete", "DELETE", "", "", "", nil, true},
		{"untyped empty put", "PUT", "", "", "", nil, true},
		{"untyped patch with a body", "PATCH", "x", "", "Bearer t", nil, false},
		{"get", "GET", "", "text/plain", "", nil, true},
		{"head", "HEAD", "", "", "", nil, true},
		{"options", "OPTIONS", "", "text/plain", "", nil, true},
		{"unparsable", "POST", "x", "application/json;;", "", nil, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, "/", strings.NewReader(tt.body))
		if tt.body == "" {
			r = httptest.NewRequest(tt.method, "/", http.NoBody)
		}
		if tt.ct != "" {
			r.Header.Set("Content-Type", tt.ct)
		}
		if tt.authz != "" {
			r.Header.Set("Authorization", tt.authz)
		}
		if err := httpguard.ContentType(r, tt.allowed...); (err == nil) != tt.ok {
			t.Errorf("%s: %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	// A chunked body (unknown length) is a body.
	r := httptest.NewRequest("POST", "/", strings.NewReader("x"))
	r.ContentLength = -1
	if httpguard.ContentType(r) == nil {
		t.Error("an untyped chunked body passed")
	}
}

func FuzzHostsAllowed(f *testing.F) {
	for _, s := range []string{"localhost:80", "[::1]", "evil.example", "127.0.0.1", "[", ":1", "a:b:c"} {
		f.Add(s)
	}
	h := httpguard.NewHosts([]string{"dev.example"})
	f.Fuzz(func(t *testing.T, host string) {
		if !h.Allowed(host) {
			return
		}
		// What is allowed names loopback or the listed name, nothing else.
		name := httpguard.HostName(host)
		if name != "dev.example" && !httpguard.LoopbackName(name) {
			t.Fatalf("Allowed(%q): %q is neither loopback nor listed", host, name)
		}
	})
}

func FuzzContentType(f *testing.F) {
	for _, s := range []string{"application/json", "text/plain", "", "application/json; charset=utf-8", "multipart/form-data; boundary=x"} {
		f.Add("POST", s, "body")
	}
	f.Fuzz(func(t *testing.T, method, ct, body string) {
		r, err := http.NewRequest(method, "http://x/", strings.NewReader(body))
		if err != nil {
			return
		}
		r.Header.Set("Content-Type", ct)
		if httpguard.ContentType(r) == nil && httpguard.StateChanging(r.Method) && ct != "" {
			// Whatever passed declared JSON.
			if !strings.Contains(strings.ToLower(ct), "application/json") {
				t.Fatalf("%s with Content-Type %q passed", method, ct)
			}
		}
	})
}
