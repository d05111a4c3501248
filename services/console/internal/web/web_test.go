package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

const scriptPayload = `<script>alert("x")</script>`

// services is one httptest server answering as the gateway, the runner, the
// Librarian and the bus's HTTP API, with a <script> payload in every text
// it returns. These are unit tests of the console's own handling; the
// integration test runs it against the real services.
func services(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/agents", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer bad" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"code":16,"message":"invalid token"}`)
			return
		}
		fmt.Fprintf(w, `{"agents":[{"agent_id":"a1","name":%q,"capabilities":["chat"],"server_id":"dev","busy":true,"connected_at":"2025-01-01T00:00:00Z"}]}`, scriptPayload)
	})
	mux.HandleFunc("POST /v1/agents/{id}/messages", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "gone" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"code":5,"message":"agent gone is not connected"}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"request_id":"r1","event":{"request_id":"r1","thinking":"hmm"}}`,
			`{"request_id":"r1","event":{"request_id":"r1","text":"<b>hi</b> "}}`,
			`{"request_id":"r1","event":{"request_id":"r1","tool_use":{"id":"t1","name":"clock","input_json":"{}"}}}`,
			`{"request_id":"r1","event":{"request_id":"r1","done":{"full_response":"<b>hi</b>"}}}`,
		} {
			fmt.Fprintf(w, "event: message\ndata: %s\n\n", ev)
		}
		fmt.Fprint(w, "event: end\ndata: {}\n\n")
	})
	mux.HandleFunc("GET /v1/agents/{id}/threads", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "a1" || r.URL.Query().Get("page_size") != "50" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"code":3,"message":"unexpected request"}`)
			return
		}
		fmt.Fprintf(w, `{"threads":[{"thread_id":"th/1","agent_id":"a1","client_id":%q,"started_at":"2025-01-01T00:00:00Z"}],"next_page_token":""}`, scriptPayload)
	})
	mux.HandleFunc("GET /v1/threads/{id}/messages", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.PathValue("id") == "gone":
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"code":5,"message":"thread \"gone\" not found"}`)
			return
		case r.URL.Query().Get("page_token") == "":
			// Two pages: the message and the first event, then the rest.
			fmt.Fprintf(w, `{"entries":[
{"entry_id":"e0","thread_id":"th/1","request_id":"r1","agent_id":"a1","time":"2025-01-01T00:00:00Z","message":{"sender":"ann","content":%q,"attachments":[{"filename":"notes.md","mime_type":"text/markdown","size":12}],"client_id":"token:01"}},
{"entry_id":"e1","thread_id":"th/1","request_id":"r1","agent_id":"a1","time":"2025-01-01T00:00:01Z","event":{"request_id":"r1","text":"<b>hi</b>"}}
],"next_page_token":"p2"}`, scriptPayload)
		default:
			fmt.Fprint(w, `{"entries":[
{"entry_id":"e2","thread_id":"th/1","request_id":"r1","agent_id":"a1","time":"2025-01-01T00:00:01Z","event":{"request_id":"r1","file":{"filename":"out.txt","mime_type":"text/plain"}},"file":{"filename":"out.txt","mime_type":"text/plain","size":9}},
{"entry_id":"e3","thread_id":"th/1","request_id":"r1","agent_id":"a1","time":"2025-01-01T00:00:02Z","event":{"request_id":"r1","done":{"full_response":"<b>hi</b>"}}},
{"entry_id":"e4","thread_id":"th/1","request_id":"r1","agent_id":"a1","time":"2025-01-01T00:00:02Z","outcome":{"ending":"ENDING_DONE"}},
{"entry_id":"e5","thread_id":"th/1","request_id":"r2","agent_id":"a1","time":"2025-01-01T00:01:00Z","message":{"content":"again","client_id":"token:01"}},
{"entry_id":"e6","thread_id":"th/1","request_id":"r2","agent_id":"a1","time":"2025-01-01T00:01:01Z","outcome":{"ending":"ENDING_AGENT_GONE","code":14,"message":"agent a1 disconnected"}}
],"next_page_token":""}`)
		}
	})
	mux.HandleFunc("GET /v1/dead-letters", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"dead_letters":[{"id":"dl1","message_id":"m1","topic":"t:1","payload":{"text":%q},"attempts":3,"last_error":%q}],"cursor":""}`, scriptPayload, scriptPayload)
	})
	mux.HandleFunc("GET /v1/dead-letters/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":"dl1","message_id":"m1","topic":"t:1","payload":{"text":%q},"attempts":3,"last_error":"x"}`, scriptPayload)
	})
	mux.HandleFunc("GET /reviews", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer bad" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"unauthorized","message":"invalid token"}`)
			return
		}
		if r.URL.Query().Get("status") == "decided" {
			if r.Header.Get("Authorization") == "Bearer old" {
				// A Librarian from before the decided list.
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":{"code":400,"status":"unsupported_status","message":"only status=escalated requests wait for a review"}}`)
				return
			}
			fmt.Fprintf(w, `{"requests":[{"request_id":"req-listed","agent_id":"claude-3","decision":"approved","decided_at":"2025-01-01T00:00:00Z","decided_by":"reviewer","reviewer":"alice","comment":%q,"request":{"request_id":"req-listed","status":"approved"}}]}`, scriptPayload)
			return
		}
		fmt.Fprintf(w, `{"requests":[{"request_id":"req-1","status":"escalated","response":{"request_id":"req-1","status":"escalated","escalation_reason":%q}}]}`, scriptPayload)
	})
	mux.HandleFunc("GET /api/v1/agents", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer bad" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"unauthorized","message":"invalid token"}`)
			return
		}
		if r.URL.Query().Get("page_token") == "tok-2" {
			fmt.Fprint(w, `{"instances":[{"id":"inst-older","task_id":"task-0","agent_type":"example","status":"completed","progress":100,"started_at":"2024-12-31T00:00:00Z"}],"next_page_token":""}`)
			return
		}
		fmt.Fprintf(w, `{"instances":[{"id":"inst-listed","task_id":"task-1","agent_type":%q,"status":"running","progress":40,"started_at":"2025-01-01T00:00:00Z"}],"next_page_token":"tok-2"}`, scriptPayload)
	})
	mux.HandleFunc("GET /api/v1/agent-types", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"agent_types":[{"id":"example","enabled":true,"protocol":"acp"}]}`)
	})
	mux.HandleFunc("GET /api/v1/agents/{id}/status", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer bad" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"unauthorized","message":"invalid token"}`)
			return
		}
		fmt.Fprintf(w, `{"id":%q,"status":"running","progress":40}`, r.PathValue("id"))
	})
	mux.HandleFunc("GET /api/v1/agents/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "{\"time\":\"2025-01-01T00:00:00Z\",\"stream\":\"stderr\",\"text\":%q}\n", scriptPayload)
	})
	mux.HandleFunc("GET /api/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != knownTrace {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"data":null,"total":0,"limit":0,"offset":0,"errors":[{"code":404,"msg":"trace not found"}]}`)
			return
		}
		// Out of order, as Jaeger may list them: a child before its
		// parent, and a span whose parent never arrived.
		fmt.Fprintf(w, `{"data":[{"traceID":%[1]q,"spans":[
{"traceID":%[1]q,"spanID":"b2","operationName":"bus deliver","references":[{"refType":"CHILD_OF","traceID":%[1]q,"spanID":"a1"}],"startTime":1700000000500000,"duration":250000,"tags":[{"key":"otel.status_code","type":"string","value":"ERROR"},{"key":"otel.status_description","type":"string","value":%[2]q}],"processID":"p2"},
{"traceID":%[1]q,"spanID":"a1","operationName":%[2]q,"references":[],"startTime":1700000000000000,"duration":1000000,"tags":[{"key":"span.kind","type":"string","value":"server"}],"processID":"p1"},
{"traceID":%[1]q,"spanID":"c3","operationName":"late","references":[{"refType":"CHILD_OF","traceID":%[1]q,"spanID":"zz"}],"startTime":1700000000900000,"duration":100000,"tags":[],"processID":"p1"}],
"processes":{"p1":{"serviceName":"conclave-gateway","tags":[]},"p2":{"serviceName":"conclave-bus","tags":[]}}}],"total":0,"limit":0,"offset":0,"errors":null}`, knownTrace, scriptPayload)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// knownTrace is the trace the fake Jaeger of services has.
const knownTrace = "4bf92f3577b34da6a3ce929d0e0e4736"

// closedURL is an address nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

type consoleEnv struct {
	srv   *httptest.Server
	codec *session.Codec
	h     *Handler
}

// newConsole serves the console's routes against the given service URLs.
func newConsole(t *testing.T, open bool, gatewayURL, busURL, runnerURL, librarianURL string) *consoleEnv {
	t.Helper()
	codec, err := session.NewCodec(session.GenerateKey(), time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	client := func(name, base string) *backend.Client {
		return &backend.Client{Service: name, Base: func() string { return base }, HTTP: http.DefaultClient, Timeout: 5 * time.Second}
	}
	wsURL := strings.Replace(busURL, "http://", "ws://", 1)
	h, err := New(t.Context(), Options{
		Codec: codec, Open: open, JaegerURL: "http://jaeger.example:16686", JaegerQueryURL: librarianURL, LibrarianAgentID: "gemini-pro",
		Gateway:         backend.Gateway{Client: client("gateway", gatewayURL)},
		Bus:             backend.Bus{Client: client("bus", busURL), WebSocketURL: func() string { return wsURL }},
		Runner:          backend.Runner{Client: client("runner", runnerURL)},
		Librarian:       backend.Librarian{Client: client("librarian", librarianURL)},
		Jaeger:          backend.Jaeger{Client: client("jaeger", librarianURL)},
		RefreshInterval: 50 * time.Millisecond, MaxStreams: 10, StreamMaxAge: time.Minute, ChatTimeout: time.Minute, MaxChats: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Routes(mux.Handle, mux.Handle)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &consoleEnv{srv: srv, codec: codec, h: h}
}

// cookie is a session cookie for s.
func (e *consoleEnv) cookie(t *testing.T, s session.Session) *http.Cookie {
	t.Helper()
	ck, err := e.codec.Cookie(s)
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

// do sends a request without following redirects.
func (e *consoleEnv) do(t *testing.T, method, path string, ck *http.Cookie, form url.Values, header map[string]string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if ck != nil {
		req.AddCookie(ck)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

func TestHTMLFromServicesIsEscaped(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	ck := e.cookie(t, e.codec.New(session.Tokens{}, true))
	e.h.instances.add(knownInstance{ID: "i1"})
	for _, path := range []string{"/", "/agents", "/agents/a1/threads", "/threads/th%2F1", "/bus", "/bus/dead-letters/dl1", "/librarian", "/runner", "/traces/" + knownTrace} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			resp, body := e.do(t, "GET", path, ck, nil, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if strings.Contains(body, "<script>alert") {
				t.Fatalf("a service's <script> reached the page unescaped:\n%s", body)
			}
			if !strings.Contains(body, "&lt;script&gt;alert") {
				t.Fatalf("the payload is not shown escaped:\n%s", body)
			}
			if got := resp.Header.Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") {
				t.Fatalf("CSP: %q", got)
			}
		})
	}
	// Logs reach the page through a stream, as JSON the script puts in as
	// text: the JSON itself escapes < and >.
	resp, body := e.do(t, "GET", "/live/runner/i1/logs", ck, nil, map[string]string{"Accept": "text/event-stream"})
	if resp.StatusCode != http.StatusOK || strings.Contains(body, "<script>") || !strings.Contains(body, `\u003cscript\u003e`) {
		t.Fatalf("logs stream: %d %s", resp.StatusCode, body)
	}
}

func TestDownServiceShowsABannerOnItsPanelOnly(t *testing.T) {
	t.Parallel()
	svc := services(t)
	down := closedURL(t)
	e := newConsole(t, true, svc.URL, svc.URL, down, svc.URL)
	ck := e.cookie(t, e.codec.New(session.Tokens{}, true))
	e.h.instances.add(knownInstance{ID: "i1"})
	resp, body := e.do(t, "GET", "/", ck, nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d", resp.StatusCode)
	}
	if !strings.Contains(body, `data-banner="runner"`) || !strings.Contains(body, "UNAVAILABLE") {
		t.Fatalf("no banner for the runner:\n%s", body)
	}
	for _, other := range []string{"gateway", "bus", "librarian"} {
		if strings.Contains(body, `data-banner="`+other+`"`) {
			t.Errorf("the %s has a banner though it is up", other)
		}
	}
	if !strings.Contains(body, "&lt;script&gt;alert") { // the agent's name: the gateway's panel still works
		t.Error("the agents panel is empty")
	}
	resp, body = e.do(t, "GET", "/runner", ck, nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-banner="runner"`) {
		t.Fatalf("runner page: %d %s", resp.StatusCode, body)
	}
}

func TestBadInputIsRefusedClearly(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	s := e.codec.New(session.Tokens{}, true)
	ck := e.cookie(t, s)
	tok := e.codec.CSRFToken(s)
	tests := []struct {
		name, method, path string
		form               url.Values
		status             int
		want               string
	}{
		{"chat without a message", "POST", "/chats", url.Values{"csrf": {tok}, "agent_id": {"a1"}, "content": {" "}}, 400, "1 byte to 256 KiB"},
		{"chat without an agent", "POST", "/chats", url.Values{"csrf": {tok}, "content": {"hi"}}, 400, "agent_id is required"},
		{"chat with an agent id not UTF-8", "POST", "/chats", url.Values{"csrf": {tok}, "agent_id": {"\xff\xfe"}, "content": {"hi"}}, 400, "agent_id must be valid UTF-8"},
		{"a dead letter id not UTF-8", "GET", "/bus/dead-letters/%FF%FE", nil, 400, "dead_letter_id"},
		{"redriving an over-long dead letter id", "POST", "/bus/dead-letters/" + strings.Repeat("a", 10000) + "/redrive", url.Values{"csrf": {tok}}, 400, "dead_letter_id"},
		{"a decision on an id not UTF-8", "POST", "/librarian/reviews/%FF%FE/decision", url.Values{"csrf": {tok}, "decision": {"approve"}, "comment": {"ok"}}, 400, "request_id"},
		{"chat too long", "POST", "/chats", url.Values{"csrf": {tok}, "agent_id": {"a1"}, "content": {strings.Repeat("x", maxMessageBytes+1)}}, 400, "256 KiB"},
		{"payload not an object", "POST", "/bus/publish", url.Values{"csrf": {tok}, "topic": {"t"}, "payload": {"[1]"}}, 400, "JSON object"},
		{"topic with a control character", "POST", "/bus/publish", url.Values{"csrf": {tok}, "topic": {"a\x01"}, "payload": {"{}"}}, 400, "control character"},
		{"launch without a type", "POST", "/runner/launch", url.Values{"csrf": {tok}, "workspace_path": {"/tmp"}}, 400, "agent type is required"},
		{"a decision without a comment", "POST", "/librarian/reviews/r/decision", url.Values{"csrf": {tok}, "decision": {"approve"}}, 400, "comment"},
		{"a bad pattern", "GET", "/live/bus?pattern=", nil, 400, "pattern is required"},
		{"an unknown chat", "GET", "/chats/nope", nil, 404, "no such chat"},
		{"find without an id", "GET", "/runner/find?id=", nil, 400, "instance_id is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := e.do(t, tt.method, tt.path, ck, tt.form, nil)
			if resp.StatusCode != tt.status || !strings.Contains(body, tt.want) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
		})
	}
}

// An id in a URL must not retarget the page's forms: ids the instance_id
// rule (pkg/ids) refuses are a 400, and every id a template puts in a URL
// path is escaped as one segment.
func TestIDsInURLsCannotRetargetForms(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	s := e.codec.New(session.Tokens{}, true)
	ck := e.cookie(t, s)
	tok := e.codec.CSRFToken(s)
	for _, path := range []string{
		"/runner/instances/x%2F..%2F..%2Fbus%2Fdead-letters%2Fredrive%3F",
		"/runner/instances/%2E%2E",
		"/runner/instances/a%23b",
		"/runner/instances/a%00b",
		"/runner/instances/%FF%FE",
	} {
		resp, body := e.do(t, "GET", path, ck, nil, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "instance_id") || strings.Contains(body, "redrive") || strings.Contains(body, tok) {
			t.Errorf("GET %s: %d, want 400 naming instance_id, without a form\n%s", path, resp.StatusCode, body)
		}
	}
	for _, path := range []string{"/runner/instances/a%2Fb/cancel", "/runner/instances/a%2Fb/prompt"} {
		resp, _ := e.do(t, "POST", path, ck, url.Values{"csrf": {tok}, "message": {"hi"}}, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s: %d, want 400", path, resp.StatusCode)
		}
	}
	resp, _ := e.do(t, "GET", "/live/runner/a%2F..%2Fb/logs", ck, nil, map[string]string{"Accept": "text/event-stream"})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("logs of a bad id: %d, want 400", resp.StatusCode)
	}
	// Ids the rule accepts keep their forms on their own page, escaped.
	for path, action := range map[string]string{
		"/runner/instances/a.b":   `action="/runner/instances/a.b/cancel"`,
		"/runner/instances/a%3Fb": `action="/runner/instances/a%3Fb/cancel"`,
	} {
		resp, body := e.do(t, "GET", path, ck, nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, action) {
			t.Errorf("GET %s: %d, want its page with %s", path, resp.StatusCode, action)
		}
	}
	resp, _ = e.do(t, "GET", "/runner/find?id="+url.QueryEscape("x/../../bus"), ck, nil, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("find a bad id: %d, want 400", resp.StatusCode)
	}
	// A good id still opens its page, with its forms where they belong.
	resp, body := e.do(t, "GET", "/runner/instances/0a1b-c2_D", ck, nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `action="/runner/instances/0a1b-c2_D/cancel"`) ||
		!strings.Contains(body, `data-live="/live/runner/0a1b-c2_D/logs"`) {
		t.Fatalf("a good id: %d %s", resp.StatusCode, body)
	}

	// Ids from the services are escaped as path segments.
	var out bytes.Buffer
	err := e.h.tmpl.ExecuteTemplate(&out, "bus", page{CSRF: "tok", D: busData{DeadLetters: []backend.DeadLetter{{ID: "x/../../runner/launch?"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if html := out.String(); strings.Contains(html, "/x/../") || !strings.Contains(html, `action="/bus/dead-letters/x%2F..%2F..%2Frunner%2Flaunch%3F/redrive"`) {
		t.Fatalf("bus page:\n%s", html)
	}
	out.Reset()
	err = e.h.tmpl.ExecuteTemplate(&out, "librarian", page{CSRF: "tok", D: librarianData{
		Queue: []*librarianv1.RequestStatus{{RequestId: "r/../../bus/publish?"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if html := out.String(); strings.Contains(html, "/r/../") || !strings.Contains(html, `action="/librarian/reviews/r%2F..%2F..%2Fbus%2Fpublish%3F/decision"`) {
		t.Fatalf("librarian page:\n%s", html)
	}
	out.Reset()
	err = e.h.tmpl.ExecuteTemplate(&out, "runner", page{CSRF: "tok", D: runnerData{Instances: []instanceRow{{knownInstance: knownInstance{ID: "i/../x"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if html := out.String(); strings.Contains(html, "/i/../") || !strings.Contains(html, `href="/runner/instances/i%2F..%2Fx"`) {
		t.Fatalf("runner page:\n%s", html)
	}
}

// TestTracePage: the console's view of a trace read from Jaeger's query
// API: spans in tree order whatever order Jaeger lists them in, errors
// marked, and a clear page for each way it cannot be drawn.
func TestTracePage(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	ck := e.cookie(t, e.codec.New(session.Tokens{}, true))

	resp, body := e.do(t, "GET", "/traces/"+strings.ToUpper(knownTrace), ck, nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	order := []string{`data-span="a1"`, `data-span="b2"`, `data-span="c3"`}
	last := -1
	for _, want := range order {
		at := strings.Index(body, want)
		if at <= last {
			t.Fatalf("spans not in tree order (%s at %d, after %d):\n%s", want, at, last, body)
		}
		last = at
	}
	for _, want := range []string{
		`<tr class="span error" data-service="conclave-bus" data-span="b2">`,
		`<td class="op d1" title="depth 1">bus deliver <strong class="err">ERROR</strong>: &lt;script&gt;`,
		`<td class="num">+500.0ms</td><td class="num">250.0ms</td>`,
		`<rect x="500" y="0" width="250" height="10"/>`,
		`<span class="svc">conclave-gateway</span> 2</li><li><span class="svc">conclave-bus</span> 1</li>`,
		`href="http://jaeger.example:16686/trace/` + knownTrace + `"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s:\n%s", want, body)
		}
	}

	for _, c := range []struct {
		name, path string
		jaeger     string
		status     int
		want       string
	}{
		{"not in Jaeger yet", "/traces/" + strings.Repeat("ab", 16), svc.URL, http.StatusNotFound, "NOT IN JAEGER YET"},
		{"not an id", "/traces/xyz", svc.URL, http.StatusBadRequest, "32 hexadecimal digits"},
		{"all zero", "/traces/" + strings.Repeat("0", 32), svc.URL, http.StatusBadRequest, "32 hexadecimal digits"},
		{"no Jaeger configured", "/traces/" + knownTrace, "", http.StatusNotFound, "CONCLAVE_CONSOLE_JAEGER_URL"},
		{"no way to Jaeger's UI", "/traces/" + knownTrace, svc.URL, http.StatusOK, `id="waterfall"`},
		{"Jaeger down", "/traces/" + knownTrace, closedURL(t), http.StatusBadGateway, "UNAVAILABLE:</strong> the jaeger cannot be reached"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
			e.h.o.JaegerQueryURL = c.jaeger
			if c.name == "no way to Jaeger's UI" {
				e.h.o.JaegerURL = ""
			}
			e.h.o.Jaeger = backend.Jaeger{Client: &backend.Client{Service: "jaeger", Base: func() string { return c.jaeger }, HTTP: http.DefaultClient, Timeout: 5 * time.Second}}
			resp, body := e.do(t, "GET", c.path, e.cookie(t, e.codec.New(session.Tokens{}, true)), nil, nil)
			if resp.StatusCode != c.status || !strings.Contains(body, c.want) {
				t.Fatalf("%d, want %d with %q:\n%s", resp.StatusCode, c.status, c.want, body)
			}
		})
	}
}

// TestTracePageSaysWhatItLeftOut: a trace past the spans the page draws
// says how many more Jaeger has.
func TestTracePageSaysWhatItLeftOut(t *testing.T) {
	t.Parallel()
	e := newConsole(t, true, closedURL(t), closedURL(t), closedURL(t), closedURL(t))
	tr := &backend.Trace{ID: knownTrace, Spans: []backend.Span{{ID: "a", Service: "bus", Operation: "bus publish"}}, Truncated: 7}
	var buf bytes.Buffer
	if err := e.h.tmpl.ExecuteTemplate(&buf, "tracepage", page{D: traceData{ID: knownTrace, Trace: tr, Rows: waterfall(tr), MaxSpans: backend.MaxTraceSpans}}); err != nil {
		t.Fatal(err)
	}
	if want := "1 (and 7 more, past the 2000 this page shows: see Jaeger)"; !strings.Contains(buf.String(), want) {
		t.Fatalf("the page lacks %q:\n%s", want, buf.String())
	}
}

func TestThreadPages(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	ck := e.cookie(t, e.codec.New(session.Tokens{}, true))

	resp, body := e.do(t, "GET", "/agents", ck, nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="/agents/a1/threads"`) {
		t.Fatalf("the agents page links no threads: %d\n%s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/agents/a1/threads", ck, nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `<a href="/threads/th%2F1"><code>th/1</code></a>`) {
		t.Fatalf("threads: %d\n%s", resp.StatusCode, body)
	}

	resp, body = e.do(t, "GET", "/threads/th%2F1", ck, nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("thread: %d\n%s", resp.StatusCode, body)
	}
	// Both pages, in order: each message with its answer and its end.
	for _, want := range []string{
		"ann → <code>a1</code>", "&lt;script&gt;alert", "attachment: notes.md (text/markdown, 12 bytes)",
		`<span class="kind">text</span> <span class="text">&lt;b&gt;hi&lt;/b&gt;</span>`,
		`<span class="kind">file</span> <code>out.txt</code> <span class="text">text/plain, 9 bytes (not kept)</span>`,
		"Ended: done", "token:01 → <code>a1</code>", "again", "Ended: agent_gone (agent a1 disconnected)",
	} {
		i := strings.Index(body, want)
		if i < 0 {
			t.Fatalf("the thread page lacks %q:\n%s", want, body)
		}
		body = body[i+len(want):]
	}

	// A chat's page links its thread.
	s := e.codec.New(session.Tokens{}, true)
	ck = e.cookie(t, s)
	resp, body = e.do(t, "POST", "/chats", ck, url.Values{"agent_id": {"a1"}, "content": {"hello"}},
		map[string]string{"Accept": "application/json", "X-CSRF-Token": e.codec.CSRFToken(s)})
	var started struct {
		ChatID string `json:"chat_id"`
	}
	if err := json.Unmarshal([]byte(body), &started); resp.StatusCode != http.StatusCreated || err != nil {
		t.Fatalf("start a chat: %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/chats/"+started.ChatID, ck, nil, nil)
	if want := `<a href="/threads/console-` + started.ChatID + `">`; resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
		t.Fatalf("the chat page lacks %s: %d\n%s", want, resp.StatusCode, body)
	}

	for _, tt := range []struct {
		path   string
		status int
		want   string
	}{
		{"/threads/gone", http.StatusNotFound, "not found"},
		{"/threads/a%20b", http.StatusBadRequest, "thread_id"},
		{"/agents/a%20b/threads", http.StatusBadRequest, "agent_id"},
	} {
		resp, body := e.do(t, "GET", tt.path, ck, nil, nil)
		if resp.StatusCode != tt.status || !strings.Contains(body, tt.want) {
			t.Errorf("%s: %d, want %d with %q:\n%s", tt.path, resp.StatusCode, tt.status, tt.want, body)
		}
	}
}
