package web

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/services/console/internal/backend"
	"github.com/conclave-ai/conclave/services/console/internal/session"
)

// traceData is a trace as the console draws it: a waterfall, each span a
// row with its bar placed on the trace's time line (0 to barScale).
type traceData struct {
	ID       string
	Jaeger   panel
	NotFound bool
	Trace    *backend.Trace
	Rows     []traceRow
	JaegerUI string
	MaxSpans int
}

type traceRow struct {
	backend.Span
	// Indent is the row's depth as a CSS class suffix, capped so that a
	// deep trace stays readable (the depth is also in the row's title).
	Indent int
	// X and Width place the span's bar, in thousandths of the trace.
	X, Width int
}

const barScale = 1000

// maxIndent is the deepest indentation the stylesheet has a class for.
const maxIndent = 12

// traceView serves /traces/{id}: the trace read from Jaeger's query API,
// drawn by the console itself, with a link to Jaeger's own page when the
// browser's way there is known.
func (h *Handler) traceView(w http.ResponseWriter, r *http.Request, s session.Session) {
	id := strings.ToLower(r.PathValue("id"))
	if !isTraceID(id) {
		h.problem(w, r, http.StatusBadRequest, "A trace id is 32 hexadecimal digits, not all zero.")
		return
	}
	if h.o.JaegerQueryURL == "" {
		h.problem(w, r, http.StatusNotFound, "No Jaeger is configured: set CONCLAVE_CONSOLE_JAEGER_URL (or CONCLAVE_CONSOLE_JAEGER_QUERY_URL) to show traces.")
		return
	}
	d := traceData{ID: id, JaegerUI: h.jaegerUI(id), MaxSpans: backend.MaxTraceSpans}
	t, err := h.o.Jaeger.Trace(r.Context(), id)
	status := http.StatusOK
	switch {
	case err == nil:
		d.Trace, d.Rows = t, waterfall(t)
	case backend.StatusOf(err) == http.StatusNotFound:
		// Spans reach Jaeger in batches, seconds after the request.
		d.NotFound, status = true, http.StatusNotFound
	default:
		d.Jaeger = panelOf("jaeger", err)
		status = http.StatusBadGateway
	}
	h.render(w, r, status, "tracepage", s, page{Title: "Trace " + id, D: d})
}

func waterfall(t *backend.Trace) []traceRow {
	rows := make([]traceRow, len(t.Spans))
	total := max(t.Duration, time.Microsecond)
	for i, s := range t.Spans {
		x := int(int64(s.Offset) * barScale / int64(total))
		width := max(int(int64(s.Duration)*barScale/int64(total)), 1)
		x = min(max(x, 0), barScale-1)
		rows[i] = traceRow{Span: s, Indent: min(s.Depth, maxIndent), X: x, Width: min(width, barScale-x)}
	}
	return rows
}

func isTraceID(id string) bool {
	if len(id) != 32 || id == strings.Repeat("0", 32) {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// duration formats a span's time to three significant digits or so:
// 1.24s, 35.2ms, 870µs.
func duration(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%dµs", d.Microseconds())
	}
}
