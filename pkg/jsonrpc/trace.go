package jsonrpc

import (
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/jsonscan"
)

// traceContext is fixed rather than taken from otel's global propagator:
// params._meta.traceparent is a wire format the bus, the runner and ACP
// agents agree on, not a deployment choice.
var traceContext propagation.TraceContext

const metaMember = "_meta"

// InjectTraceContext returns params with the trace context of ctx's span
// written into params._meta (traceparent and, when set, tracestate), where
// ACP and the bus carry it. Other members of _meta are kept. Params are
// returned unchanged when ctx has no valid span, when they are not a JSON
// object (an array has nowhere to put it), when they are not valid JSON, or
// when _meta is present but neither an object nor null.
func InjectTraceContext(ctx context.Context, params json.RawMessage) json.RawMessage {
	if !trace.SpanContextFromContext(ctx).IsValid() || !json.Valid(params) {
		return params
	}
	return injectTrace(ctx, params)
}

// ExtractTraceContext returns ctx carrying the remote span context found in
// params._meta, so that spans started from it are children of the caller's
// span. It returns ctx unchanged when params carry none.
func ExtractTraceContext(ctx context.Context, params json.RawMessage) context.Context {
	if !json.Valid(params) {
		return ctx
	}
	return extractTrace(ctx, params)
}

// injectTrace is InjectTraceContext for params known to be valid JSON.
func injectTrace(ctx context.Context, params json.RawMessage) json.RawMessage {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return params
	}
	start := jsonscan.SkipSpace(params, 0)
	if start == len(params) || params[start] != '{' {
		return params
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)

	obj := params[start:]
	var it iter
	it.init(obj)
	for it.nextMember() {
		if string(it.key) != metaMember {
			continue
		}
		switch it.val[0] {
		case '{', 'n':
		default:
			return params // someone else's _meta; not ours to overwrite
		}
		// Splice a rebuilt _meta over the old value.
		valStart := it.i - len(it.val)
		out := make([]byte, 0, len(obj)+128)
		out = append(out, obj[:valStart]...)
		out = appendMeta(out, carrier, it.val)
		return append(out, obj[valStart+len(it.val):]...)
	}

	// No _meta yet: it becomes the first member.
	out := make([]byte, 0, len(obj)+128)
	out = append(out, `{"_meta":`...)
	out = appendMeta(out, carrier, nil)
	if rest := obj[jsonscan.SkipSpace(obj, 1):]; rest[0] != '}' {
		out = append(out, ',')
		return append(out, rest...)
	}
	return append(out, '}')
}

// appendMeta appends a _meta object holding the carrier's fields and the
// other members of old (an object, JSON null, or nil).
func appendMeta(b []byte, carrier propagation.MapCarrier, old []byte) []byte {
	b = append(b, '{')
	n := 0
	for _, k := range traceContext.Fields() {
		v, ok := carrier[k]
		if !ok {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, v)
		n++
	}
	if len(old) > 0 && old[0] == '{' {
		var it iter
		it.init(old)
		for it.nextMember() {
			if isTraceField(string(it.key)) {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			b = appendString(b, string(it.key))
			b = append(b, ':')
			b = append(b, it.val...)
			n++
		}
	}
	return append(b, '}')
}

// isTraceField reports whether key is one of the W3C fields. Injection drops
// any old values of them even when it does not write them again: a
// tracestate left over from another trace would be wrong.
func isTraceField(key string) bool {
	for _, f := range traceContext.Fields() {
		if f == key {
			return true
		}
	}
	return false
}

// extractTrace is ExtractTraceContext for params known to be valid JSON.
func extractTrace(ctx context.Context, params json.RawMessage) context.Context {
	start := jsonscan.SkipSpace(params, 0)
	if start == len(params) || params[start] != '{' {
		return ctx
	}
	var it iter
	it.init(params[start:])
	for it.nextMember() {
		if string(it.key) != metaMember {
			continue
		}
		if it.val[0] != '{' {
			return ctx
		}
		carrier := propagation.MapCarrier{}
		var meta iter
		meta.init(it.val)
		for meta.nextMember() {
			if !isTraceField(string(meta.key)) {
				continue
			}
			if s, ok := parseString(meta.val); ok {
				carrier[string(meta.key)] = s
			}
		}
		if len(carrier) == 0 {
			return ctx
		}
		return traceContext.Extract(ctx, carrier)
	}
	return ctx
}
