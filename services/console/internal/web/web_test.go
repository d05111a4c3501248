package web

import (
	"bufio"
	"bytes"
	"context"
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

func TestExpiredSessionGoesToSignIn(t *testing.T) {
	t.Parallel()
	svc := services(t)
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			t.Parallel()
			e := newConsole(t, open, svc.URL, svc.URL, svc.URL, svc.URL)
			s := e.codec.New(session.Tokens{Gateway: "t"}, false)
			s.Expires = time.Now().Add(-time.Minute).Unix()
			ck := e.cookie(t, s)
			ck.MaxAge = 0
			resp, _ := e.do(t, "GET", "/agents", ck, nil, nil)
			if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/signin?") ||
				!strings.Contains(resp.Header.Get("Location"), "expired=1") {
				t.Fatalf("expired session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
			}
			// A stream or a script gets 401 and JSON instead.
			resp, body := e.do(t, "GET", "/live/agents", ck, nil, map[string]string{"Accept": "text/event-stream"})
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "expired") {
				t.Fatalf("expired session on a stream: %d %s", resp.StatusCode, body)
			}
			// The sign-in page says so.
			resp, body = e.do(t, "GET", "/signin?expired=1", nil, nil, nil)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="expired"`) {
				t.Fatalf("sign-in page: %d %s", resp.StatusCode, body)
			}
		})
	}
}

func TestNoSession(t *testing.T) {
	t.Parallel()
	svc := services(t)
	closed := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	resp, _ := closed.do(t, "GET", "/runner?x=1", nil, nil, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/signin?next=%2Frunner%3Fx%3D1" {
		t.Fatalf("closed console without a session: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	open := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	resp, body := open.do(t, "GET", "/agents", nil, nil, nil)
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("open console without a session: %d %v", resp.StatusCode, resp.Cookies())
	}
	if !strings.Contains(body, `name="csrf-token"`) {
		t.Fatal("the page carries no CSRF token")
	}
}

func TestFormsNeedTheSessionsCSRFToken(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	s := e.codec.New(session.Tokens{Gateway: "t"}, false)
	ck := e.cookie(t, s)
	good := e.codec.CSRFToken(s)
	other := e.codec.CSRFToken(e.codec.New(session.Tokens{}, false))
	posts := []string{"/signout", "/chats", "/chats/x/cancel", "/bus/publish", "/bus/dead-letters/dl1/redrive", "/bus/dead-letters/redrive",
		"/runner/launch", "/runner/instances/i1/prompt", "/runner/instances/i1/cancel", "/librarian/reviews/req-1/decision"}
	tests := []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no token", url.Values{"x": {"1"}}, nil},
		{"another session's token", url.Values{"csrf": {other}}, nil},
		{"the token from another site", url.Values{"csrf": {good}}, map[string]string{"Origin": "http://evil.example"}},
	}
	for _, path := range posts {
		for _, tt := range tests {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				resp, body := e.do(t, "POST", path, ck, tt.form, tt.header)
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "did not come from this console") {
					t.Fatalf("POST %s: %d %s", path, resp.StatusCode, body)
				}
			})
		}
	}
	// A script's request gets the JSON error shape.
	resp, body := e.do(t, "POST", "/chats", ck, url.Values{}, map[string]string{"Accept": "application/json"})
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, `"code":403`) {
		t.Fatalf("JSON 403: %d %s", resp.StatusCode, body)
	}
	// With the token, the same form goes through (to the Librarian).
	resp, _ = e.do(t, "POST", "/librarian/reviews/req-1/decision", ck, url.Values{"csrf": {good}, "decision": {"maybe"}, "comment": {"c"}}, map[string]string{"Origin": e.srv.URL})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a form with the token was refused: %d", resp.StatusCode)
	}
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

// sseEvents reads a whole event stream.
func sseEvents(t *testing.T, body string) [][2]string {
	t.Helper()
	var out [][2]string
	var event string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			out = append(out, [2]string{event, strings.TrimPrefix(line, "data: ")})
		}
	}
	return out
}

func TestChatStreamsTheReply(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	s := e.codec.New(session.Tokens{}, true)
	ck := e.cookie(t, s)
	csrf := map[string]string{"Accept": "application/json", "X-CSRF-Token": e.codec.CSRFToken(s)}
	resp, body := e.do(t, "POST", "/chats", ck, url.Values{"agent_id": {"a1"}, "content": {"hello"}}, csrf)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	var started struct{ ChatID, Events, TraceID, TraceURL string }
	if err := json.Unmarshal([]byte(body), &struct {
		ChatID   *string `json:"chat_id"`
		Events   *string `json:"events"`
		TraceID  *string `json:"trace_id"`
		TraceURL *string `json:"trace_url"`
	}{&started.ChatID, &started.Events, &started.TraceID, &started.TraceURL}); err != nil {
		t.Fatal(err)
	}
	if len(started.TraceID) != 32 || started.TraceURL != "/traces/"+started.TraceID {
		t.Errorf("trace %q %q", started.TraceID, started.TraceURL)
	}
	resp, body = e.do(t, "GET", started.Events, ck, nil, map[string]string{"Accept": "text/event-stream"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d %s", resp.StatusCode, body)
	}
	var kinds []string
	for _, ev := range sseEvents(t, body) {
		if ev[0] == "event" {
			var ce chatEvent
			if err := json.Unmarshal([]byte(ev[1]), &ce); err != nil {
				t.Fatal(err)
			}
			kinds = append(kinds, ce.Kind)
		} else {
			kinds = append(kinds, "("+ev[0]+")")
		}
	}
	if got, want := strings.Join(kinds, " "), "(chat) thinking text tool_use done end (end)"; got != want {
		t.Fatalf("events: %s, want %s", got, want)
	}
	if strings.Contains(body, "<b>") {
		t.Fatal("the agent's markup is raw in the stream")
	}
	// Another session cannot read it.
	resp, _ = e.do(t, "GET", started.Events, e.cookie(t, e.codec.New(session.Tokens{}, true)), nil, map[string]string{"Accept": "text/event-stream"})
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another session read the chat: %d", resp.StatusCode)
	}
	// A reconnecting EventSource resumes after the last event it saw.
	resp, body = e.do(t, "GET", started.Events, ck, nil, map[string]string{"Accept": "text/event-stream", "Last-Event-ID": "3"})
	if evs := sseEvents(t, body); resp.StatusCode != http.StatusOK || len(evs) != 2 || evs[0][0] != "event" || !strings.Contains(evs[0][1], `"end"`) {
		t.Fatalf("resumed: %v", evs)
	}
	// An unknown agent: the gateway's 404 ends the chat with its reason.
	resp, body = e.do(t, "POST", "/chats", ck, url.Values{"agent_id": {"gone"}, "content": {"hello"}}, csrf)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	_ = json.Unmarshal([]byte(body), &struct {
		Events *string `json:"events"`
	}{&started.Events})
	_, body = e.do(t, "GET", started.Events, ck, nil, map[string]string{"Accept": "text/event-stream"})
	if !strings.Contains(body, `"kind":"failed"`) || !strings.Contains(body, "not connected") {
		t.Fatalf("a chat with an unknown agent: %s", body)
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

// signinForm gets the sign-in form: its pre-session cookie and the
// token its hidden field repeats.
func (e *consoleEnv) signinForm(t *testing.T) (*http.Cookie, string) {
	t.Helper()
	resp, body := e.do(t, "GET", "/signin", nil, nil, nil)
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == session.SignInCookieName {
			ck = c
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("the sign-in form's cookie: %+v", resp.Cookies())
	}
	const field = `name="signin_csrf" value="`
	i := strings.Index(body, field)
	if i < 0 {
		t.Fatalf("no sign-in token in the form:\n%s", body)
	}
	tok, _, _ := strings.Cut(body[i+len(field):], `"`)
	if tok != ck.Value {
		t.Fatalf("the form's token %q is not the cookie's %q", tok, ck.Value)
	}
	return ck, tok
}

func TestSignIn(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	ck, tok := e.signinForm(t)
	resp, body := e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}, "gateway_token": {"bad"}, "next": {"/agents"}}, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "gateway refused its token") || !strings.Contains(body, tok) {
		t.Fatalf("a refused token: %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "at least one token") {
		t.Fatalf("no token: %d %s", resp.StatusCode, body)
	}
	resp, _ = e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}, "gateway_token": {"good-token"}, "next": {"//evil.example/x"}}, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("sign-in: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	cks := resp.Cookies()
	if len(cks) != 1 || cks[0].Name != session.CookieName || strings.Contains(cks[0].Value, "good-token") {
		t.Fatalf("cookie: %v", cks)
	}
	s, err := e.codec.Decode(cks[0].Value)
	if err != nil || s.Tokens.Gateway != "good-token" || s.Open {
		t.Fatalf("session %+v %v", s, err)
	}
}

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/agents": "/agents", "/bus?pattern=a": "/bus?pattern=a", "": "/", "//evil": "/", "http://evil": "/",
		"/\\evil": "/", "/signin": "/", "/x\r\nSet-Cookie: a": "/",
		"/\t/evil.example": "/", "/\x00/evil.example": "/", "/\x7f/evil": "/", "/\x1b/evil": "/", "\t//evil": "/",
		"/%2F/evil.example": "/", "/%2f%2fevil": "/", "https:/evil": "/", "javascript:alert(1)": "/",
		"/runner/instances/a-b?done=launched": "/runner/instances/a-b?done=launched", "/bus#dlq": "/bus#dlq",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTooManyStreams(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, true, svc.URL, svc.URL, svc.URL, svc.URL)
	e.h.o.MaxStreams = 1
	s := e.codec.New(session.Tokens{}, true)
	ck := e.cookie(t, s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/live/agents", nil)
	req.AddCookie(ck)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// Read its first event, so the stream is surely open.
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	second, body := e.do(t, "GET", "/live/agents", ck, nil, map[string]string{"Accept": "text/event-stream"})
	if second.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "limit of 1 live streams") {
		t.Fatalf("second stream: %d %s", second.StatusCode, body)
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

// Every session the runner accepts sees the runner's instances (its
// tokens are not scoped to instances), a page at a time; a refused one sees
// none. Only a session the Librarian accepts as a reviewer sees its
// decisions, as the Librarian lists them, or, from a Librarian that does
// not list them, those made from the console.
func TestSessionsSeeWhatTheServicesAllow(t *testing.T) {
	t.Parallel()
	svc := services(t)
	e := newConsole(t, false, svc.URL, svc.URL, svc.URL, svc.URL)
	a := e.codec.New(session.Tokens{Runner: "ra", Reviewer: "reviewer"}, false)
	b := e.codec.New(session.Tokens{Runner: "rb", Bus: "bus"}, false)
	bad := e.codec.New(session.Tokens{Runner: "bad", Reviewer: "bad"}, false)
	old := e.codec.New(session.Tokens{Reviewer: "old"}, false)
	cka, ckb, ckbad, ckold := e.cookie(t, a), e.cookie(t, b), e.cookie(t, bad), e.cookie(t, old)

	for _, path := range []string{"/runner", "/"} {
		for name, ck := range map[string]*http.Cookie{"a": cka, "b": ckb} {
			if _, body := e.do(t, "GET", path, ck, nil, nil); !strings.Contains(body, `href="/runner/instances/inst-listed"`) {
				t.Errorf("%s's %s does not list the runner's instance:\n%s", name, path, body)
			}
		}
		if _, body := e.do(t, "GET", path, ckbad, nil, nil); strings.Contains(body, "inst-listed") || !strings.Contains(body, `data-banner="runner"`) {
			t.Errorf("a refused session's %s lists the runner's instance:\n%s", path, body)
		}
	}
	_, body := e.do(t, "GET", "/runner", cka, nil, nil)
	if !strings.Contains(body, `href="/runner?page=tok-2"`) || strings.Contains(body, "inst-older") {
		t.Errorf("the first page:\n%s", body)
	}
	_, body = e.do(t, "GET", "/runner?page=tok-2", cka, nil, nil)
	if !strings.Contains(body, "inst-older") || strings.Contains(body, "inst-listed") || strings.Contains(body, "instances-next") || !strings.Contains(body, `id="instances-first"`) {
		t.Errorf("the second page:\n%s", body)
	}
	if resp, _ := e.do(t, "GET", "/runner?page="+strings.Repeat("A", maxPageToken+1), cka, nil, nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("an oversized page token: %d", resp.StatusCode)
	}

	e.h.recordOwnDecision(decision{RequestID: "req-secret", Outcome: "approved", Source: "console", Comment: "private", At: timeNow()})
	if _, body := e.do(t, "GET", "/librarian", cka, nil, nil); !strings.Contains(body, "req-listed") || !strings.Contains(body, "reviewer (alice)") ||
		!strings.Contains(body, "as the Librarian lists them") || strings.Contains(body, "req-secret") {
		t.Errorf("the reviewer does not see the Librarian's decisions:\n%s", body)
	}
	if _, body := e.do(t, "GET", "/librarian", ckbad, nil, nil); strings.Contains(body, "req-listed") || strings.Contains(body, "req-secret") || strings.Contains(body, "private") {
		t.Errorf("a session whose reviewer token is refused sees decisions:\n%s", body)
	}
	if _, body := e.do(t, "GET", "/librarian", ckold, nil, nil); !strings.Contains(body, "req-secret") || !strings.Contains(body, "did not list its decisions") {
		t.Errorf("with a Librarian that does not list decisions, the console's own are not shown:\n%s", body)
	}
}

// Login CSRF: another site cannot sign a browser in with its own tokens.
func TestSignInNeedsItsFormsToken(t *testing.T) {
	t.Parallel()
	svc := services(t)
	for _, open := range []bool{false, true} {
		e := newConsole(t, open, svc.URL, svc.URL, svc.URL, svc.URL)
		ck, tok := e.signinForm(t)
		other := &http.Cookie{Name: session.SignInCookieName, Value: strings.Repeat("A", 43)}
		good := url.Values{"signin_csrf": {tok}, "gateway_token": {"attacker-token"}}
		for name, c := range map[string]struct {
			ck     *http.Cookie
			form   url.Values
			header map[string]string
		}{
			"no cookie, no field":       {nil, url.Values{"gateway_token": {"attacker-token"}}, nil},
			"no cookie":                 {nil, good, nil},
			"no field":                  {ck, url.Values{"gateway_token": {"attacker-token"}}, nil},
			"another cookie":            {other, good, nil},
			"a field of another length": {ck, url.Values{"signin_csrf": {tok + "x"}, "gateway_token": {"attacker-token"}}, nil},
			"Origin: null":              {ck, good, map[string]string{"Origin": "null"}},
			"another origin":            {ck, good, map[string]string{"Origin": "https://evil.example"}},
		} {
			resp, body := e.do(t, "POST", "/signin", c.ck, c.form, c.header)
			if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
				t.Errorf("open=%v, %s: %d %v %s", open, name, resp.StatusCode, resp.Cookies(), body)
			}
		}
		resp, _ := e.do(t, "POST", "/signin", ck, good, map[string]string{"Origin": e.srv.URL})
		if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
			t.Errorf("open=%v, the console's own form: %d %v", open, resp.StatusCode, resp.Cookies())
		}
		if open {
			// conclave dev: continuing without any token still works.
			resp, _ := e.do(t, "POST", "/signin", ck, url.Values{"signin_csrf": {tok}}, map[string]string{"Origin": e.srv.URL})
			if resp.StatusCode != http.StatusSeeOther {
				t.Errorf("open, continue without a token: %d", resp.StatusCode)
			}
		}
	}
}

// A reconnecting EventSource sends the last line's id as Last-Event-ID:
// the replayed tail is sent only from the line after it.
func TestLogsResumeAfterLastEventID(t *testing.T) {
	t.Parallel()
	svc := services(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/agents/{id}/status", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":%q,"status":"running","progress":40}`, r.PathValue("id"))
	})
	mux.HandleFunc("GET /api/v1/agents/{id}/logs", func(w http.ResponseWriter, r *http.Request) {
		// Two lines share a time, as lines written together do.
		for i, at := range []string{"2025-01-01T00:00:01Z", "2025-01-01T00:00:02Z", "2025-01-01T00:00:02Z", "2025-01-01T00:00:03Z"} {
			fmt.Fprintf(w, "{\"time\":%q,\"stream\":\"stdout\",\"text\":\"line %d\"}\n", at, i)
		}
	})
	runner := httptest.NewServer(mux)
	t.Cleanup(runner.Close)
	e := newConsole(t, true, svc.URL, svc.URL, runner.URL, svc.URL)
	ck := e.cookie(t, e.codec.New(session.Tokens{}, true))
	lines := func(lastID string) (texts, ids []string) {
		t.Helper()
		h := map[string]string{"Accept": "text/event-stream"}
		if lastID != "" {
			h["Last-Event-ID"] = lastID
		}
		resp, body := e.do(t, "GET", "/live/runner/i1/logs", ck, nil, h)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		for _, ev := range sseEvents(t, body) {
			if ev[0] == "line" {
				var l logEvent
				if err := json.Unmarshal([]byte(ev[1]), &l); err != nil {
					t.Fatal(err)
				}
				texts = append(texts, l.Text)
			}
		}
		for _, l := range strings.Split(body, "\n") {
			if id, ok := strings.CutPrefix(l, "id: "); ok {
				ids = append(ids, id)
			}
		}
		return texts, ids
	}
	all, ids := lines("")
	if strings.Join(all, ",") != "line 0,line 1,line 2,line 3" || len(ids) != 4 {
		t.Fatalf("the first connection: %q ids %q", all, ids)
	}
	for i, want := range []string{"line 1,line 2,line 3", "line 2,line 3", "line 3", ""} {
		got, _ := lines(ids[i])
		if strings.Join(got, ",") != want {
			t.Errorf("after %s (line %d): %q, want %q", ids[i], i, got, want)
		}
	}
	// An id the console did not make replays the tail, as a new stream.
	if got, _ := lines("garbage"); len(got) != 4 {
		t.Errorf("after a foreign id: %q", got)
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
