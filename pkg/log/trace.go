package log

import (
	"context"
	"log/slog"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// Attribute keys added by the trace handler. They follow the OpenTelemetry
// log data model names so log backends can link records to traces.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// traceHandler adds TraceIDKey and SpanIDKey to records whose context holds a
// valid span context.
//
// The ids must stay top-level even under WithGroup, otherwise log backends
// cannot find them. A wrapped handler that has been given a group puts every
// later attribute inside it, so groups are never passed down: inner holds only
// the attributes added before the first group, and the open groups (with
// their own attributes) are rebuilt as nested group values on each record.
type traceHandler struct {
	inner  slog.Handler
	groups []openGroup // outermost first
}

type openGroup struct {
	name  string
	attrs []slog.Attr
}

// NewTraceHandler wraps h so that every record logged with a context carrying
// a valid OpenTelemetry span context gets the attributes trace_id and span_id
// at the top level, whatever groups the logger has opened.
func NewTraceHandler(h slog.Handler) slog.Handler {
	return &traceHandler{inner: h}
}

func (h *traceHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if len(h.groups) > 0 {
		r = h.nest(r)
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		// Clone so that appending cannot write into an array shared with
		// another handler holding the same record.
		r = r.Clone()
		r.AddAttrs(
			slog.String(TraceIDKey, sc.TraceID().String()),
			slog.String(SpanIDKey, sc.SpanID().String()),
		)
	}
	return h.inner.Handle(ctx, r)
}

func (h *traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	if len(h.groups) == 0 {
		// Without open groups the inner handler can pre-format the
		// attributes once instead of on every record.
		return &traceHandler{inner: h.inner.WithAttrs(attrs)}
	}
	groups := slices.Clone(h.groups)
	last := &groups[len(groups)-1]
	last.attrs = append(slices.Clip(last.attrs), attrs...)
	return &traceHandler{inner: h.inner, groups: groups}
}

func (h *traceHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &traceHandler{
		inner:  h.inner,
		groups: append(slices.Clip(h.groups), openGroup{name: name}),
	}
}

// nest returns a copy of r whose attributes are wrapped in h's open groups.
// Empty groups vanish in slog.GroupValue, matching how the standard handlers
// treat a WithGroup followed by no attributes.
func (h *traceHandler) nest(r slog.Record) slog.Record {
	attrs := make([]slog.Attr, 0, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, a)
		return true
	})
	for i := len(h.groups) - 1; i >= 0; i-- {
		g := h.groups[i]
		attrs = []slog.Attr{{Key: g.name, Value: slog.GroupValue(append(slices.Clip(g.attrs), attrs...)...)}}
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(attrs...)
	return out
}
