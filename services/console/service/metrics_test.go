package service_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/console/internal/session"
	"github.com/conclave-ai/conclave/services/console/service"
)

func encodeKey(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

// TestMetrics drives each event of docs/metrics.md's console table and
// checks that its metric moved, and that the table lists every metric the
// console exports.
func TestMetrics(t *testing.T) {
	t.Parallel()
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer bad":
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"code":16,"message":"invalid token"}`)
		default:
			fmt.Fprint(w, `{"agents":[]}`)
		}
	}))
	defer gateway.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()
	tel, err := telemetry.New(t.Context(), telemetry.Config{ServiceName: "console-metrics-test"})
	if err != nil {
		t.Fatal(err)
	}
	key := session.GenerateKey()
	cfg := service.Config{HTTPAddr: "127.0.0.1:0", GatewayURL: gateway.URL, BusURL: "ws" + strings.TrimPrefix(down, "http"),
		RunnerURL: down, LibrarianURL: gateway.URL, SessionTTL: time.Hour,
		SessionKey: encodeKey(key), BackendTimeout: 5 * time.Second, ChatTimeout: time.Minute, RefreshInterval: time.Second,
		MaxStreams: 16, StreamMaxAge: time.Minute, ShutdownTimeout: 5 * time.Second,
		// No regrowth within the test, however loaded the machine.
		AuthThrottle: auth.ThrottleSetting{Burst: auth.ThrottleBurst, Every: time.Hour}}
	c, err := service.New(cfg, service.Deps{Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { stop(); <-done }()
	<-c.Ready()
	base := c.URL()

	codec, _ := session.NewCodec(key, time.Hour, false)
	good := codec.New(session.Tokens{Gateway: "good"}, false)
	get := func(path string, s *session.Session, header map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if s != nil {
			ck, _ := codec.Cookie(*s)
			req.AddCookie(ck)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// ok (gateway), unavailable (runner), unauthorized (gateway, bad token).
	get("/", &good, nil).Body.Close()
	get("/runner", &good, nil).Body.Close()
	bad := codec.New(session.Tokens{Gateway: "bad"}, false)
	get("/agents", &bad, nil).Body.Close()
	// Refusals: csrf, expired_session, signin.
	ck, _ := codec.Cookie(good)
	req, _ := http.NewRequest("POST", base+"/bus/publish", strings.NewReader("topic=x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(ck)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a form without CSRF: %v %v", resp, err)
	}
	expired := good
	expired.Expires = time.Now().Add(-time.Minute).Unix()
	get("/agents", &expired, nil).Body.Close()
	// The sign-in form's own token: its pre-session cookie, repeated.
	signinCK := &http.Cookie{Name: session.SignInCookieName, Value: strings.Repeat("t", 43)}
	sreqSignin, _ := http.NewRequest("POST", base+"/signin", strings.NewReader(url.Values{"gateway_token": {"bad"}, "signin_csrf": {signinCK.Value}}.Encode()))
	sreqSignin.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	sreqSignin.AddCookie(signinCK)
	if resp, err := http.DefaultClient.Do(sreqSignin); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a refused sign-in: %v %v", resp, err)
	}
	// Sign-ins refused too often from one address are throttled: 429 with
	// Retry-After from it, while another address is still heard.
	signin := func(client *http.Client) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/signin", strings.NewReader(url.Values{"gateway_token": {"bad"}, "signin_csrf": {signinCK.Value}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(signinCK)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i := 1; i < auth.ThrottleBurst; i++ {
		if resp := signin(http.DefaultClient); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("refused sign-in %d: %d, want 401", i+1, resp.StatusCode)
		}
	}
	if resp := signin(http.DefaultClient); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("one refused sign-in too many: %d, Retry-After %q; want 429 with it", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp := signin(testenv.ClientFrom(testenv.OtherLoopback)); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a sign-in from another address: %d, want 401", resp.StatusCode)
	}
	// A stream: open while scraping.
	sctx, cancelStream := context.WithCancel(context.Background())
	sreq, _ := http.NewRequestWithContext(sctx, "GET", base+"/live/agents", nil)
	sreq.AddCookie(ck)
	sresp, err := http.DefaultClient.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(sresp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	fams := metricstest.Scrape(t, base+"/metrics")
	checks := []struct {
		name   string
		labels []string
	}{
		{"conclave_console_backend_calls_total", []string{"service", "gateway", "outcome", "ok"}},
		{"conclave_console_backend_calls_total", []string{"service", "gateway", "outcome", "unauthorized"}},
		{"conclave_console_backend_calls_total", []string{"service", "runner", "outcome", "unavailable"}},
		{"conclave_console_backend_calls_total", []string{"service", "bus", "outcome", "unavailable"}},
		{"conclave_console_streams", []string{"kind", "agents"}},
		{"conclave_console_refusals_total", []string{"reason", "csrf"}},
		{"conclave_console_refusals_total", []string{"reason", "expired_session"}},
		{"conclave_console_refusals_total", []string{"reason", "signin"}},
		{"conclave_console_auth_throttled_total", nil},
	}
	for _, c := range checks {
		if v := fams.Value(c.name, c.labels...); v < 1 {
			t.Errorf("%s%v = %v, want at least 1", c.name, c.labels, v)
		}
	}
	sresp.Body.Close()
	cancelStream()

	var exported []string
	for name := range fams {
		if strings.HasPrefix(name, "conclave_console_") {
			exported = append(exported, name)
		}
	}
	documented := metricstest.DocumentedNames(t, "console")
	for _, name := range exported {
		if !slices.Contains(documented, name) {
			t.Errorf("%s is exported but docs/metrics.md does not list it", name)
		}
	}
	for _, name := range documented {
		if !slices.ContainsFunc(checks, func(c struct {
			name   string
			labels []string
		}) bool {
			return c.name == name
		}) {
			t.Errorf("docs/metrics.md lists %s, which this test does not drive", name)
		}
	}
}
