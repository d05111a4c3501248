package web

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/services/console/internal/session"
)

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
