package log_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/slogtest"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	clog "github.com/conclave-ai/conclave/pkg/log"
)

// spanContext starts a real SDK span so the test exercises the same span
// contexts production code sees.
func spanContext(t testing.TB) (context.Context, trace.SpanContext) {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	t.Cleanup(func() { span.End() })
	return ctx, span.SpanContext()
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(b), &m); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, b)
	}
	return m
}

func TestParseFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    clog.Format
		wantErr bool
	}{
		{in: "json", want: clog.FormatJSON},
		{in: "text", want: clog.FormatText},
		{in: " JSON ", want: clog.FormatJSON},
		{in: "", wantErr: true},
		{in: "xml", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := clog.ParseFormat(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseFormat(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseFormat(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    slog.Level
		wantErr bool
	}{
		{in: "debug", want: slog.LevelDebug},
		{in: "INFO", want: slog.LevelInfo},
		{in: "warn", want: slog.LevelWarn},
		{in: "error", want: slog.LevelError},
		{in: "info+2", want: slog.LevelInfo + 2},
		{in: "loud", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := clog.ParseLevel(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseLevel(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseLevel(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestNewTraceIDs(t *testing.T) {
	t.Parallel()
	spanCtx, sc := spanContext(t)
	remoteCtx := trace.ContextWithRemoteSpanContext(context.Background(), sc)

	tests := []struct {
		name      string
		ctx       context.Context
		logger    func(*slog.Logger) *slog.Logger
		wantTrace bool
		// group, when set, is where the record's own attribute must land.
		group []string
	}{
		{name: "span", ctx: spanCtx, wantTrace: true},
		{name: "remote span", ctx: remoteCtx, wantTrace: true},
		{name: "no span", ctx: context.Background()},
		{name: "invalid span context", ctx: trace.ContextWithSpanContext(context.Background(), trace.SpanContext{})},
		{
			name:      "with attrs",
			ctx:       spanCtx,
			logger:    func(l *slog.Logger) *slog.Logger { return l.With("a", 1) },
			wantTrace: true,
		},
		{
			name:      "with group",
			ctx:       spanCtx,
			logger:    func(l *slog.Logger) *slog.Logger { return l.WithGroup("req") },
			wantTrace: true,
			group:     []string{"req"},
		},
		{
			name: "nested groups with attrs",
			ctx:  spanCtx,
			logger: func(l *slog.Logger) *slog.Logger {
				return l.With("a", 1).WithGroup("req").With("b", 2).WithGroup("body")
			},
			wantTrace: true,
			group:     []string{"req", "body"},
		},
		{
			name:   "group without span",
			ctx:    context.Background(),
			logger: func(l *slog.Logger) *slog.Logger { return l.WithGroup("req") },
			group:  []string{"req"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			l := clog.New(&buf, clog.Options{Format: clog.FormatJSON, Service: "gateway"})
			if tt.logger != nil {
				l = tt.logger(l)
			}
			l.InfoContext(tt.ctx, "hello", "k", "v")
			m := decode(t, buf.Bytes())

			if m["service"] != "gateway" {
				t.Errorf("service = %v, want gateway", m["service"])
			}
			traceID, hasTrace := m[clog.TraceIDKey]
			spanID, hasSpan := m[clog.SpanIDKey]
			if hasTrace != tt.wantTrace || hasSpan != tt.wantTrace {
				t.Fatalf("trace_id present = %v, span_id present = %v, want %v\n%s", hasTrace, hasSpan, tt.wantTrace, buf.Bytes())
			}
			if tt.wantTrace {
				if traceID != sc.TraceID().String() || spanID != sc.SpanID().String() {
					t.Errorf("got trace_id=%v span_id=%v, want %s %s", traceID, spanID, sc.TraceID(), sc.SpanID())
				}
			}
			inner := m
			for _, g := range tt.group {
				next, ok := inner[g].(map[string]any)
				if !ok {
					t.Fatalf("group %q missing\n%s", g, buf.Bytes())
				}
				inner = next
			}
			if inner["k"] != "v" {
				t.Errorf("record attribute not in group %v\n%s", tt.group, buf.Bytes())
			}
		})
	}
}

// TestTraceHandlerConformance runs the standard library's handler test suite,
// which checks the WithAttrs/WithGroup semantics the trace handler reimplements.
func TestTraceHandlerConformance(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	newHandler := func(*testing.T) slog.Handler {
		buf.Reset()
		return clog.NewTraceHandler(slog.NewJSONHandler(&buf, nil))
	}
	result := func(t *testing.T) map[string]any { return decode(t, buf.Bytes()) }
	slogtest.Run(t, newHandler, result)
}

func TestRedact(t *testing.T) {
	t.Parallel()
	const bearer = "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig"
	tests := []struct {
		name   string
		log    func(*slog.Logger)
		secret bool // whether the logged value must be hidden
	}{
		{name: "authorization", log: func(l *slog.Logger) { l.Info("m", "Authorization", bearer) }, secret: true},
		{name: "token", log: func(l *slog.Logger) { l.Info("m", "token", bearer) }, secret: true},
		{name: "access_token", log: func(l *slog.Logger) { l.Info("m", "access_token", bearer) }, secret: true},
		{name: "camelCase", log: func(l *slog.Logger) { l.Info("m", "refreshToken", bearer) }, secret: true},
		{name: "client secret", log: func(l *slog.Logger) { l.Info("m", "CLIENT_SECRET", bearer) }, secret: true},
		{name: "password", log: func(l *slog.Logger) { l.Info("m", "db.password", bearer) }, secret: true},
		{name: "api_key", log: func(l *slog.Logger) { l.Info("m", "api_key", bearer) }, secret: true},
		{name: "x-api-key", log: func(l *slog.Logger) { l.Info("m", "X-Api-Key", bearer) }, secret: true},
		{name: "apiKey", log: func(l *slog.Logger) { l.Info("m", "apiKey", bearer) }, secret: true},
		{name: "in group", log: func(l *slog.Logger) { l.Info("m", slog.Group("headers", "authorization", bearer)) }, secret: true},
		{name: "logger group", log: func(l *slog.Logger) { l.WithGroup("http").With("authorization", bearer).Info("m") }, secret: true},
		{name: "with attrs", log: func(l *slog.Logger) { l.With("authorization", bearer).Info("m") }, secret: true},
		{name: "secret group", log: func(l *slog.Logger) { l.Info("m", slog.Group("secrets", "github", bearer)) }, secret: true},
		{name: "token counts stay", log: func(l *slog.Logger) { l.Info("m", "input_tokens", bearer) }},
		{name: "plain key stays", log: func(l *slog.Logger) { l.Info("m", "user", bearer) }},
	}
	for _, format := range []clog.Format{clog.FormatJSON, clog.FormatText} {
		for _, tt := range tests {
			t.Run(string(format)+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				var buf bytes.Buffer
				tt.log(clog.New(&buf, clog.Options{Format: format}))
				out := buf.String()
				// The text handler quotes values with spaces, so look for the
				// token's distinctive part, which appears verbatim either way.
				leaked := strings.Contains(out, "c2VjcmV0")
				if tt.secret && (leaked || !strings.Contains(out, clog.Redacted)) {
					t.Errorf("secret not redacted:\n%s", out)
				}
				if !tt.secret && (!leaked || strings.Contains(out, clog.Redacted)) {
					t.Errorf("non-secret value redacted:\n%s", out)
				}
			})
		}
	}
}

func TestNewLevelAndFormat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opts    clog.Options
		want    string
		wantOut bool
	}{
		{name: "json default", opts: clog.Options{}, want: `"msg":"hello"`, wantOut: true},
		{name: "text", opts: clog.Options{Format: clog.FormatText}, want: "msg=hello", wantOut: true},
		{name: "below level", opts: clog.Options{Level: slog.LevelWarn}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			clog.New(&buf, tt.opts).Info("hello")
			if got := buf.Len() > 0; got != tt.wantOut {
				t.Fatalf("output present = %v, want %v: %q", got, tt.wantOut, buf.String())
			}
			if !strings.Contains(buf.String(), tt.want) {
				t.Errorf("output %q does not contain %q", buf.String(), tt.want)
			}
		})
	}
}

// BenchmarkHandler shows the cost the trace handler adds over a bare JSON
// handler for a record logged inside a span.
func BenchmarkHandler(b *testing.B) {
	ctx, _ := spanContext(b)
	handlers := []struct {
		name string
		h    slog.Handler
	}{
		{name: "slog-json", h: slog.NewJSONHandler(io.Discard, nil)},
		{name: "trace-json", h: clog.NewTraceHandler(slog.NewJSONHandler(io.Discard, nil))},
	}
	for _, bb := range handlers {
		b.Run(bb.name, func(b *testing.B) {
			l := slog.New(bb.h).With("service", "bench")
			b.ReportAllocs()
			for b.Loop() {
				l.InfoContext(ctx, "request handled", "method", "GET", "status", 200)
			}
		})
	}
}
