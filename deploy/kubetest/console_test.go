//go:build linux

package kubetest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// consoleSession is a browser's side of the console: its Service's base
// URL as the test reaches it (the ClusterIP, through kube-proxy) and the
// cookie jar holding the pre-session and session cookies. The Service's
// ClientIP affinity keeps its requests on one replica, which holds its
// chats; the session cookie, sealed with the Secret's key, is good at
// every replica.
type consoleSession struct {
	base   string
	client *http.Client
}

// console is the session testConsole signs in, kept for the check after
// the upgrade (the pods it signed in at are gone by then).
var console *consoleSession

// consoleSession is a new browser session of the console of the release
// in ns.
func (e *chartEnv) consoleSession(t *testing.T, ctx context.Context, ns string) *consoleSession {
	t.Helper()
	svc, err := e.admin.CoreV1().Services(ns).Get(ctx, release+"-console", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &consoleSession{
		base: "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "8090"),
		client: &http.Client{
			Jar:       jar,
			Transport: &http.Transport{DialContext: e.node.DialContext},
		},
	}
}

// get fetches path (following redirects) and returns the final status,
// URL path and body.
func (s *consoleSession) get(ctx context.Context, path string) (int, string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		return 0, "", "", err
	}
	return s.do(req)
}

func (s *consoleSession) do(req *http.Request) (int, string, string, error) {
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Request.URL.Path, string(body), err
}

func (s *consoleSession) postForm(ctx context.Context, path string, form url.Values, accept string) (int, string, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return s.do(req)
}

var (
	signinCSRF = regexp.MustCompile(`name="signin_csrf" value="([^"]+)"`)
	pageCSRF   = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	banner     = regexp.MustCompile(`data-banner="([a-z]+)"`)
)

// testConsole checks the console through its Service: health and
// readiness, the sign-in page, a sign-in with the gateway's, bus's and
// runner's tokens (which the console checks against each service, at the
// addresses the chart gave it), an overview whose gateway, bus and runner
// panels answer (listing the agent testGateway started) while the
// Librarian's, which is not on the node, shows its banner, and a chat
// with that agent streamed back through the console.
func testConsole(t *testing.T, e *chartEnv) {
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	s := e.consoleSession(t, ctx, namespace)
	for _, path := range []string{"/healthz", "/readyz"} {
		status, _, body, err := s.get(ctx, path)
		if err != nil || status != http.StatusOK {
			t.Fatalf("GET %s through the Service: %d %v\n%s", path, status, err, body)
		}
	}

	// Not signed in: the overview sends the browser to the sign-in form.
	status, path, body, err := s.get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	m := signinCSRF.FindStringSubmatch(body)
	if status != http.StatusOK || path != "/signin" || m == nil || !strings.Contains(body, `name="gateway_token"`) {
		t.Fatalf("GET / without a session: %d at %s, want the sign-in form:\n%.2000s", status, path, body)
	}
	status, path, body, err = s.postForm(ctx, "/signin", url.Values{
		"signin_csrf": {m[1]}, "next": {"/"},
		"gateway_token": {clientToken}, "bus_token": {busToken}, "runner_token": {runnerToken},
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || path != "/" {
		t.Fatalf("sign-in: %d at %s, want the overview:\n%.3000s", status, path, body)
	}
	checkOverview(t, body)
	console = s

	// A chat with the agent, streamed from the gateway through the
	// console's own Server-Sent Events.
	_, _, body, err = s.get(ctx, "/agents")
	if err != nil {
		t.Fatal(err)
	}
	m = pageCSRF.FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, agentID) {
		t.Fatalf("the agents page lacks a form token or agent %s:\n%.3000s", agentID, body)
	}
	const content = "hello through the console"
	status, _, body, err = s.postForm(ctx, "/chats", url.Values{"csrf": {m[1]}, "agent_id": {agentID}, "content": {content}}, "application/json")
	if err != nil || status != http.StatusCreated {
		t.Fatalf("POST /chats: %d %v\n%s", status, err, body)
	}
	var chat struct {
		Events  string `json:"events"`
		TraceID string `json:"trace_id"`
	}
	if err := json.Unmarshal([]byte(body), &chat); err != nil || chat.Events == "" {
		t.Fatalf("POST /chats answered %s (%v)", body, err)
	}
	text, kinds := s.readChat(t, ctx, chat.Events)
	if want := "You said: " + content + "\n"; !strings.HasPrefix(text, want) {
		t.Fatalf("the chat's reply is %q (events %v), want it to start with %q", text, kinds, want)
	}
	t.Logf("chat through the console: trace %s, events %v", chat.TraceID, kinds)
}

// checkOverview checks an overview page: the gateway, bus and runner
// panels answer, with the test's agent listed, and the Librarian's, which
// has no URL here, says it cannot be reached.
func checkOverview(t *testing.T, body string) {
	t.Helper()
	var banners []string
	for _, m := range banner.FindAllStringSubmatch(body, -1) {
		banners = append(banners, m[1])
	}
	if strings.Join(banners, ",") != "librarian" {
		t.Errorf("the overview's banners are %v, want only the Librarian's (not on the node):\n%.4000s", banners, body)
	}
	if !strings.Contains(body, "<code>"+agentID+"</code>") {
		t.Errorf("the overview does not list agent %s:\n%.4000s", agentID, body)
	}
}

// readChat reads a chat's event stream to its end and returns the reply's
// text and the kinds of event seen.
func (s *consoleSession) readChat(t *testing.T, ctx context.Context, path string) (string, []string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, data)
	}
	var text strings.Builder
	var kinds []string
	event := ""
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "event":
			var ev struct {
				Kind string `json:"kind"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				t.Fatalf("chat event %s: %v", line, err)
			}
			kinds = append(kinds, ev.Kind)
			switch ev.Kind {
			case "text":
				text.WriteString(ev.Text)
			case "error", "failed":
				t.Fatalf("the chat failed: %s (text so far %q)", ev.Text, text.String())
			}
		case strings.HasPrefix(line, "data: ") && event == "end":
			return text.String(), kinds
		}
	}
	t.Fatalf("the chat's stream ended before its end event (%v); events %v, text %q", sc.Err(), kinds, text.String())
	return "", nil
}

// testConsoleAfterUpgrade: the session signed in before the upgrade, at
// pods that are gone, is still good at the new ones (every replica seals
// and opens cookies with the Secret's key), and they reach the gateway,
// bus and runner.
func testConsoleAfterUpgrade(t *testing.T, e *chartEnv) {
	if console == nil {
		t.Fatal("no console session from before the upgrade")
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	defer cancel()
	// The agent reconnects through the gateway's Service after its
	// replica drained (GatewayAfterUpgrade waited for that): the
	// overview lists it again once the console's next read sees it.
	var body string
	testenv.EventuallyNoError(t, waitLimit, "the overview to list agent "+agentID+" after the upgrade", func() error {
		status, path, b, err := console.get(ctx, "/")
		if err != nil {
			t.Fatal(err)
		}
		if path != "/" || status != http.StatusOK {
			t.Fatalf("the session from before the upgrade: %d at %s, want the overview (the new pods cannot open its cookie?):\n%.2000s", status, path, b)
		}
		if body = b; !strings.Contains(body, "<code>"+agentID+"</code>") {
			return fmt.Errorf("the overview:\n%.4000s", body)
		}
		return nil
	})
	checkOverview(t, body)
}

// consoleURLs are the console's service URLs in the install's values: the
// node has no cluster DNS, so instead of the Services' names (the chart's
// default) they use the addresses the kubelet puts in every pod's
// environment, which Kubernetes expands in env values, as the coven
// agent's pod dials the gateway.
func consoleURLs() string {
	return fmt.Sprintf(`console:
  urls:
    gateway: "http://$(%[1]s_GATEWAY_SERVICE_HOST):$(%[1]s_GATEWAY_SERVICE_PORT_HTTP)"
    bus: "ws://$(%[1]s_BUS_SERVICE_HOST):$(%[1]s_BUS_SERVICE_PORT_HTTP)"
    runner: "http://$(%[1]s_RUNNER_SERVICE_HOST):$(%[1]s_RUNNER_SERVICE_PORT_HTTP)"
  secret:
    eventsBusTokenKey: events-bus-token
`, strings.ToUpper(release))
}
