package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/metrics"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

// timeNow is the clock of what the console records.
var timeNow = func() time.Time { return time.Now().UTC() }

func pathEscape(s string) string { return url.PathEscape(s) }

// contextWithSpan returns base carrying the span context of from, so that
// work outliving a request stays in its trace.
func contextWithSpan(base, from context.Context) context.Context {
	return trace.ContextWithSpanContext(base, trace.SpanContextFromContext(from))
}

// heartbeat is how often an idle stream sends a comment, so that proxies
// and the browser see it alive.
const heartbeat = 20 * time.Second

// sse is one Server-Sent Events response.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	mu sync.Mutex
}

// startSSE takes a stream slot and starts the response; it answers 503
// itself and returns nil when the console holds too many streams.
func (h *Handler) startSSE(w http.ResponseWriter, r *http.Request, kind string) (*sse, context.Context, func()) {
	if n := h.streams.Add(1); h.o.MaxStreams > 0 && n > int64(h.o.MaxStreams) {
		h.streams.Add(-1)
		h.o.Metrics.Refused(metrics.RefusedBusy)
		w.Header().Set("Retry-After", "5")
		writeJSONError(w, http.StatusServiceUnavailable, fmt.Sprintf("the console holds its limit of %d live streams; retry later", h.o.MaxStreams))
		return nil, nil, nil
	}
	closeMetric := h.o.Metrics.Stream(kind)
	ctx, cancel := context.WithTimeout(r.Context(), h.o.StreamMaxAge)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s, ctx, func() { cancel(); closeMetric(); h.streams.Add(-1) }
}

// send writes one event; data is JSON, which never holds a raw newline
// (and encoding/json escapes <, > and & besides).
func (s *sse) send(event, id string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if id != "" {
		fmt.Fprintf(&b, "id: %s\n", id)
	}
	fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", event, data)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) ping() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write([]byte(": keep-alive\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}

// liveAgents sends the agents table, rendered by the same template as the
// page, whenever it changes.
func (h *Handler) liveAgents(w http.ResponseWriter, r *http.Request, s session.Session) {
	st, ctx, done := h.startSSE(w, r, metrics.StreamAgents)
	if st == nil {
		return
	}
	defer done()
	last := ""
	tick := time.NewTicker(h.o.RefreshInterval)
	defer tick.Stop()
	beat := time.Now()
	for {
		list, err := h.o.Gateway.ListAgents(ctx, s.Tokens.Gateway)
		if ctx.Err() != nil {
			return
		}
		var buf bytes.Buffer
		if terr := h.tmpl.ExecuteTemplate(&buf, "agent-rows", agentsData{Agents: panelOf("gateway", err), List: list}); terr != nil {
			h.o.Logger.ErrorContext(ctx, "console template failed", "template", "agent-rows", "error", terr)
			return
		}
		switch html := buf.String(); {
		case html != last:
			ids := make([]string, 0, len(list))
			for _, a := range list {
				ids = append(ids, a.GetAgentId())
			}
			if st.send("agents", "", map[string]any{"html": html, "ids": ids, "count": len(list)}) != nil {
				return
			}
			last, beat = html, time.Now()
		case time.Since(beat) > heartbeat:
			if st.ping() != nil {
				return
			}
			beat = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// chatEvents streams a chat's events from the one after Last-Event-ID, so
// that a reconnecting EventSource misses nothing and repeats nothing.
func (h *Handler) chatEvents(w http.ResponseWriter, r *http.Request, s session.Session) {
	c, ok := h.chats.get(r.PathValue("id"), s.ID)
	if !ok {
		writeJSONError(w, http.StatusNotFound, "there is no such chat in this session")
		return
	}
	next := 0
	if last, err := strconv.Atoi(r.Header.Get("Last-Event-ID")); err == nil && last >= 0 {
		next = last + 1
	}
	st, ctx, done := h.startSSE(w, r, metrics.StreamChat)
	if st == nil {
		return
	}
	defer done()
	if next == 0 {
		if st.send("chat", "", map[string]string{"chat_id": c.ID, "agent_id": c.AgentID, "trace_id": c.TraceID, "trace_url": h.traceURL(c.TraceID)}) != nil {
			return
		}
	}
	for {
		evs, finished, changed := c.since(next)
		for _, ev := range evs {
			if st.send("event", strconv.Itoa(next), ev) != nil {
				return
			}
			next++
		}
		if finished {
			_ = st.send("end", "", map[string]string{"request_id": c.RequestID()})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(heartbeat):
			if st.ping() != nil {
				return
			}
		}
	}
}

// busBuffer bounds the messages waiting to be written to one watcher; past
// it, messages are dropped (and counted) rather than slowing the bus,
// which waits for the console's ack.
const busBuffer = 256

type busEvent struct {
	Topic     string `json:"topic"`
	Payload   string `json:"payload"`
	MessageID string `json:"message_id,omitempty"`
	TraceID   string `json:"trace_id,omitempty"`
	TraceURL  string `json:"trace_url,omitempty"`
	Received  string `json:"received"`
	Ack       string `json:"ack"`
}

// liveBus subscribes to a pattern for as long as the page watches it.
func (h *Handler) liveBus(w http.ResponseWriter, r *http.Request, s session.Session) {
	pattern := strings.TrimSpace(r.URL.Query().Get("pattern"))
	if err := validText("The pattern", pattern, maxPattern); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	st, ctx, done := h.startSSE(w, r, metrics.StreamBus)
	if st == nil {
		return
	}
	defer done()
	msgs := make(chan backend.Message, busBuffer)
	subscribedCh := make(chan struct{})
	subscribed := subscribedCh // set to nil once reported
	var dropped int
	var mu sync.Mutex
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- h.o.Bus.Watch(ctx, s.Tokens.Bus, pattern, func() { close(subscribedCh) }, func(m backend.Message) {
			select {
			case msgs <- m:
			default:
				mu.Lock()
				dropped++
				mu.Unlock()
			}
		})
	}()
	ack := fmt.Sprintf("%v", backend.WatchAck["message"])
	reported := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-subscribed:
			subscribed = nil
			if st.send("subscribed", "", map[string]string{"pattern": pattern}) != nil {
				return
			}
		case m := <-msgs:
			ev := busEvent{Topic: m.Topic, Payload: prettyJSON(m.Payload), MessageID: m.MessageID, TraceID: m.TraceID,
				TraceURL: h.traceURL(m.TraceID), Received: formatTime(m.Received), Ack: ack}
			if st.send("message", "", ev) != nil {
				return
			}
			mu.Lock()
			n := dropped
			mu.Unlock()
			if n > reported {
				reported = n
				if st.send("dropped", "", map[string]int{"count": n}) != nil {
					return
				}
			}
		case err := <-watchErr:
			if err == nil {
				return
			}
			_ = st.send("failure", "", map[string]string{"message": err.Error(), "banner": bannerText("bus", err)})
			return
		case <-time.After(heartbeat):
			if st.ping() != nil {
				return
			}
		}
	}
}

// bannerText is the banner a live panel shows when its service fails.
func bannerText(service string, err error) string {
	if backend.IsKind(err, backend.Unauthorized) {
		return "REFUSED: the " + service + " refused this session's token. " + err.Error()
	}
	return "UNAVAILABLE: " + err.Error() + ". The other panels keep working."
}

type logEvent struct {
	Time   string `json:"time"`
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

// logID is a log line's SSE id: its time (Unix nanoseconds) and its place
// among the lines of that same time, "<ns>-<n>".
type logID struct {
	at int64
	n  int
}

func (i logID) String() string { return strconv.FormatInt(i.at, 10) + "-" + strconv.Itoa(i.n) }

// before reports whether i comes before j.
func (i logID) before(j logID) bool { return i.at < j.at || i.at == j.at && i.n < j.n }

func parseLogID(s string) (logID, bool) {
	at, n, ok := strings.Cut(s, "-")
	if !ok {
		return logID{}, false
	}
	a, err1 := strconv.ParseInt(at, 10, 64)
	b, err2 := strconv.Atoi(n)
	if err1 != nil || err2 != nil || a < 0 || b < 0 {
		return logID{}, false
	}
	return logID{at: a, n: b}, true
}

// liveLogs follows an instance's logs and, beside them, its status.
func (h *Handler) liveLogs(w http.ResponseWriter, r *http.Request, s session.Session) {
	id := r.PathValue("id")
	if err := ids.InstanceID.Check(id); err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	st, ctx, done := h.startSSE(w, r, metrics.StreamLogs)
	if st == nil {
		return
	}
	defer done()
	// The status goroutine writes to the response too: it must be gone
	// before the handler returns, so stop it first, then wait for it.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// The status, read every refresh interval while the logs stream.
	wg.Go(func() {
		tick := time.NewTicker(h.o.RefreshInterval)
		defer tick.Stop()
		last := ""
		for {
			in, err := h.o.Runner.Status(ctx, s.Tokens.Runner, id)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				cur := fmt.Sprintf("%s/%d/%s", in.GetStatus(), in.GetProgress(), in.GetReviewUrl())
				if cur != last {
					last = cur
					if st.send("status", "", map[string]any{"status": in.GetStatus(), "progress": in.GetProgress(), "finished": formatProtoTime(in.GetFinishedAt()),
						"review_url": in.GetReviewUrl()}) != nil {
						stop()
						return
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	// Each line's id is its time and its place among the lines of that
	// time; an EventSource that reconnects (at StreamMaxAge, or after a
	// blip) sends the last one back as Last-Event-ID, and the replayed
	// tail is sent only from the line after it.
	resume, resuming := parseLogID(r.Header.Get("Last-Event-ID"))
	var cur logID
	err := h.o.Runner.FollowLogs(ctx, s.Tokens.Runner, id, 500, func(l backend.LogLine) {
		at := l.Time.UnixNano()
		if l.Time.IsZero() {
			at = 0
		}
		if at == cur.at {
			cur.n++
		} else {
			cur = logID{at: at}
		}
		if resuming && !resume.before(cur) {
			return
		}
		if st.send("line", cur.String(), logEvent{Time: formatTime(l.Time), Stream: l.Stream, Text: l.Text}) != nil {
			stop()
		}
	})
	switch {
	case ctx.Err() != nil:
	case err != nil && !errors.Is(err, context.Canceled):
		_ = st.send("failure", "", map[string]string{"message": err.Error(), "banner": bannerText("runner", err)})
	default:
		_ = st.send("end", "", map[string]string{"message": "the launch has ended; prompt the instance to start it again"})
	}
}
