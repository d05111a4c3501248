package jsonrpc

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

const (
	traceID     = "0af7651916cd43dd8448eb211c80319c"
	spanID      = "b7ad6b7169203331"
	traceparent = "00-" + traceID + "-" + spanID + "-01"
)

// remoteSpanContext returns a context holding the span of traceparent.
func remoteSpanContext(t *testing.T, state string) context.Context {
	t.Helper()
	tid, _ := trace.TraceIDFromHex(traceID)
	sid, _ := trace.SpanIDFromHex(spanID)
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	return trace.ContextWithSpanContext(context.Background(), sc)
}

func TestInjectTraceContext(t *testing.T) {
	t.Parallel()
	meta := `"_meta":{"traceparent":"` + traceparent + `"}`
	tests := []struct {
		name   string
		params string
		state  string
		want   string
	}{
		{name: "object", params: `{"a":1}`, want: `{` + meta + `,"a":1}`},
		{name: "empty object", params: ` { } `, want: `{` + meta + `}`},
		{name: "with tracestate", params: `{}`, state: "k=v", want: `{"_meta":{"traceparent":"` + traceparent + `","tracestate":"k=v"}}`},
		{name: "other _meta members are kept", params: `{"a":1,"_meta":{"progressToken":7,"traceparent":"stale","tracestate":"old=1"},"b":2}`,
			want: `{"a":1,"_meta":{"traceparent":"` + traceparent + `","progressToken":7},"b":2}`},
		{name: "null _meta", params: `{"_meta":null}`, want: `{` + meta + `}`},
		{name: "_meta not an object", params: `{"_meta":"mine"}`, want: `{"_meta":"mine"}`},
		{name: "array", params: `[1,2]`, want: `[1,2]`},
		{name: "invalid JSON", params: `{"a":`, want: `{"a":`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := InjectTraceContext(remoteSpanContext(t, tt.state), json.RawMessage(tt.params))
			if !json.Valid([]byte(tt.want)) {
				if string(got) != tt.want {
					t.Errorf("got %s, want %s unchanged", got, tt.want)
				}
				return
			}
			if !equalJSON(t, got, []byte(tt.want)) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			// And it reads back.
			if tt.params[0] != '[' && tt.name != "_meta not an object" {
				sc := trace.SpanContextFromContext(ExtractTraceContext(context.Background(), got))
				if sc.TraceID().String() != traceID || sc.SpanID().String() != spanID || !sc.IsRemote() || sc.TraceState().String() != tt.state {
					t.Errorf("extracted %+v", sc)
				}
			}
		})
	}

	t.Run("no span", func(t *testing.T) {
		t.Parallel()
		if got := InjectTraceContext(context.Background(), json.RawMessage(`{"a":1}`)); string(got) != `{"a":1}` {
			t.Errorf("got %s, want params unchanged", got)
		}
	})
}

func equalJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("invalid JSON %s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestExtractTraceContext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		valid  bool
	}{
		{name: "traceparent", params: `{"_meta":{"traceparent":"` + traceparent + `"},"x":[1]}`, valid: true},
		{name: "no _meta", params: `{"x":1}`},
		{name: "garbage traceparent", params: `{"_meta":{"traceparent":"00-zz"}}`},
		{name: "traceparent not a string", params: `{"_meta":{"traceparent":1}}`},
		{name: "_meta not an object", params: `{"_meta":[1]}`},
		{name: "array", params: `[{"_meta":{"traceparent":"` + traceparent + `"}}]`},
		{name: "invalid JSON", params: `{"_meta":{"traceparent":"` + traceparent + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := trace.SpanContextFromContext(ExtractTraceContext(context.Background(), json.RawMessage(tt.params)))
			if sc.IsValid() != tt.valid {
				t.Errorf("span context valid = %v, want %v", sc.IsValid(), tt.valid)
			}
		})
	}
}

// TestTracePropagation checks that a span started on one side is the parent
// of the span a handler starts on the other, as Jaeger needs to show one
// trace.
func TestTracePropagation(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		for _, notify := range []bool{false, true} {
			for _, enabled := range []bool{true, false} {
				name := tr.name + map[bool]string{false: "/call", true: "/notify"}[notify] + map[bool]string{true: "/on", false: "/off"}[enabled]
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					rec := tracetest.NewSpanRecorder()
					tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
					tracer := tp.Tracer("test")
					handled := make(chan struct{})
					h := HandlerFunc(func(ctx context.Context, req *Request) (any, error) {
						_, span := tracer.Start(ctx, "handler")
						span.End()
						close(handled)
						return nil, nil
					})
					client, _ := connPair(t, tr, nil, h, WithTracePropagation(enabled))

					ctx, parent := tracer.Start(t.Context(), "client")
					var err error
					if notify {
						err = client.Notify(ctx, "traced", map[string]int{"x": 1})
					} else {
						err = client.Call(ctx, "traced", map[string]int{"x": 1}, nil)
					}
					if err != nil {
						t.Fatal(err)
					}
					<-handled
					parent.End()

					var child sdktrace.ReadOnlySpan
					for _, s := range rec.Ended() {
						if s.Name() == "handler" {
							child = s
						}
					}
					if child == nil {
						t.Fatal("no handler span recorded")
					}
					want := parent.SpanContext()
					linked := child.Parent().SpanID() == want.SpanID() && child.SpanContext().TraceID() == want.TraceID()
					if linked != enabled {
						t.Errorf("handler span's parent = %v (trace %v), client span = %v; linked = %v, want %v",
							child.Parent().SpanID(), child.SpanContext().TraceID(), want.SpanID(), linked, enabled)
					}
					if enabled && !child.Parent().IsRemote() {
						t.Error("handler span's parent is not marked remote")
					}
				})
			}
		}
	}
}
