// Package log builds the structured loggers every Conclave binary uses.
//
// It exists so that all services agree on three things without each one
// re-deciding them: the output format (JSON in production so the log pipeline
// can index fields, text for humans in development), correlation with
// OpenTelemetry traces (every record logged with a span in its context carries
// trace_id and span_id, so a log line leads straight to its trace in Jaeger),
// and redaction (credentials must never reach log storage, even when a
// developer logs a header map or a config struct by mistake).
//
// Callers import it as clog to avoid clashing with the standard library:
//
//	import clog "github.com/conclave-ai/conclave/pkg/log"
package log

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Format selects the encoding of log records.
type Format string

const (
	// FormatJSON is the production encoding: one JSON object per line.
	FormatJSON Format = "json"
	// FormatText is the development encoding: logfmt-style key=value pairs.
	FormatText Format = "text"
)

// Options configures New.
type Options struct {
	// Format is FormatJSON or FormatText. Any other value, including the zero
	// value, yields JSON: production is the safe default, and user input
	// should be validated with ParseFormat before it gets here.
	Format Format
	// Level is the minimum level logged; the zero value is slog.LevelInfo.
	Level slog.Level
	// Service, when set, is added to every record as the attribute "service"
	// so logs from many pods can be filtered per service.
	Service string
}

// ParseFormat converts a configuration string (case-insensitive) into a
// Format, rejecting anything else so that a typo fails at startup instead of
// silently changing the log encoding.
func ParseFormat(s string) (Format, error) {
	switch f := Format(strings.ToLower(strings.TrimSpace(s))); f {
	case FormatJSON, FormatText:
		return f, nil
	default:
		return "", fmt.Errorf("log: unknown format %q (want %q or %q)", s, FormatJSON, FormatText)
	}
}

// ParseLevel converts a configuration string such as "debug", "INFO" or
// "warn+2" into a slog.Level.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.TrimSpace(s))); err != nil {
		return 0, fmt.Errorf("log: parse level: %w", err)
	}
	return l, nil
}

// New returns a logger writing to w that redacts secrets (see Redact) and
// adds trace_id/span_id to records logged with a span context (see
// NewTraceHandler). Use the *Context logging methods (InfoContext, ...) so
// the span context reaches the handler.
func New(w io.Writer, opts Options) *slog.Logger {
	ho := &slog.HandlerOptions{Level: opts.Level, ReplaceAttr: Redact}
	var h slog.Handler
	if opts.Format == FormatText {
		h = slog.NewTextHandler(w, ho)
	} else {
		h = slog.NewJSONHandler(w, ho)
	}
	l := slog.New(NewTraceHandler(h))
	if opts.Service != "" {
		l = l.With(slog.String("service", opts.Service))
	}
	return l
}
