package backend

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// span is a span of Jaeger's query API, for the tests' traces.
func span(id, parent, op, process string, start, duration int64, tags ...string) map[string]any {
	refs := []map[string]string{}
	if parent != "" {
		refs = append(refs, map[string]string{"refType": "CHILD_OF", "traceID": "t", "spanID": parent})
	}
	ts := []map[string]any{}
	for i := 0; i+1 < len(tags); i += 2 {
		var v any = tags[i+1]
		if tags[i+1] == "true" {
			v = true
		}
		ts = append(ts, map[string]any{"key": tags[i], "value": v})
	}
	return map[string]any{"spanID": id, "operationName": op, "references": refs, "startTime": start, "duration": duration, "tags": ts, "processID": process}
}

func traceJSON(t *testing.T, spans ...map[string]any) []byte {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"traceID": "t", "spans": spans,
		"processes": map[string]any{"p1": map[string]string{"serviceName": "gateway"}, "p2": map[string]string{"serviceName": "bus"}}})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// shape is a trace's spans as "id@depth", in the order drawn.
func shape(tr *Trace) string {
	var parts []string
	for _, s := range tr.Spans {
		parts = append(parts, fmt.Sprintf("%s@%d", s.ID, s.Depth))
	}
	return strings.Join(parts, " ")
}

func TestParseJaegerTrace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		spans []map[string]any
		want  string
	}{
		{"children after their parent, by start", []map[string]any{
			span("c", "a", "late child", "p2", 300, 10), span("a", "", "root", "p1", 100, 500), span("b", "a", "early child", "p2", 200, 10), span("d", "b", "grandchild", "p1", 250, 1),
		}, "a@0 b@1 d@2 c@1"},
		{"a missing parent makes a root", []map[string]any{
			span("a", "", "root", "p1", 100, 50), span("x", "gone", "orphan", "p2", 50, 10),
		}, "x@0 a@0"},
		{"a cycle is cut, each span once", []map[string]any{
			span("a", "b", "one", "p1", 100, 10), span("b", "a", "two", "p1", 200, 10), span("r", "", "root", "p2", 300, 10),
		}, "r@0 a@0 b@1"},
		{"a span its own parent", []map[string]any{span("a", "a", "self", "p1", 100, 10)}, "a@0"},
		{"duplicates and ids missing are dropped", []map[string]any{
			span("a", "", "root", "p1", 100, 10), span("a", "", "again", "p1", 100, 10), span("", "", "no id", "p1", 100, 10),
		}, "a@0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tr, err := ParseJaegerTrace(traceJSON(t, c.spans...))
			if err != nil {
				t.Fatal(err)
			}
			if got := shape(tr); got != c.want {
				t.Fatalf("drawn %s, want %s", got, c.want)
			}
		})
	}
}

func TestParseJaegerTraceFields(t *testing.T) {
	t.Parallel()
	tr, err := ParseJaegerTrace(traceJSON(t,
		span("a", "", "root", "p1", 1_000_000, 2_000_000, "span.kind", "server"),
		span("b", "a", "failed", "p2", 1_500_000, 250_000, "otel.status_code", "ERROR", "otel.status_description", "boom"),
		span("c", "a", "old style", "p2", 2_000_000, 1_500_000, "error", "true"),
		span("d", "a", "unknown process", "p9", 1_200_000, -5),
	))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Start != time.UnixMicro(1_000_000).UTC() || tr.Duration != 2500*time.Millisecond {
		t.Errorf("start %v duration %v", tr.Start, tr.Duration)
	}
	byID := map[string]Span{}
	for _, s := range tr.Spans {
		byID[s.ID] = s
	}
	if a := byID["a"]; a.Kind != "server" || a.Service != "gateway" || a.Error || a.Offset != 0 {
		t.Errorf("root %+v", a)
	}
	if b := byID["b"]; !b.Error || b.StatusMessage != "boom" || b.Offset != 500*time.Millisecond || b.Duration != 250*time.Millisecond {
		t.Errorf("failed span %+v", b)
	}
	if c := byID["c"]; !c.Error {
		t.Errorf("error=true span %+v", c)
	}
	if d := byID["d"]; d.Service != "" || d.Duration != 0 {
		t.Errorf("span of an unknown process, negative duration: %+v", d)
	}
	if got := fmt.Sprint(tr.Services); got != "[{gateway 1} { 1} {bus 2}]" {
		t.Errorf("services %s", got)
	}
}

func TestParseJaegerTraceBounds(t *testing.T) {
	t.Parallel()
	spans := make([]map[string]any, MaxTraceSpans+5)
	for i := range spans {
		spans[i] = span(fmt.Sprintf("s%d", i), "", "op", "p1", int64(i), 1)
	}
	tr, err := ParseJaegerTrace(traceJSON(t, spans...))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Spans) != MaxTraceSpans || tr.Truncated != 5 {
		t.Fatalf("%d spans drawn, %d truncated", len(tr.Spans), tr.Truncated)
	}
	for _, bad := range []string{`{"traceID":"t","spans":[]}`, `{"spans":[{"spanID":""}]}`, `[]`, `{"spans":{}}`} {
		if _, err := ParseJaegerTrace([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// FuzzParseJaegerTrace: whatever Jaeger (or something in its place)
// answers, the parse returns an error or a trace drawing every span it
// kept once, each child deeper than its parent.
func FuzzParseJaegerTrace(f *testing.F) {
	f.Add([]byte(`{"traceID":"t","spans":[{"spanID":"a","references":[{"refType":"CHILD_OF","spanID":"b"}],"startTime":5,"duration":1},{"spanID":"b","references":[{"refType":"CHILD_OF","spanID":"a"}],"startTime":1,"duration":9}]}`))
	f.Add([]byte(`{"traceID":"t","spans":[{"spanID":"a","startTime":-9223372036854775808,"duration":9223372036854775807,"processID":"p"}],"processes":{"p":{"serviceName":"s"}}}`))
	f.Add([]byte(`{"spans":[{"spanID":"a","tags":[{"key":"error","value":"yes"},{"key":"span.kind","value":3}]}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		tr, err := ParseJaegerTrace(raw)
		if err != nil {
			return
		}
		depth := map[string]int{}
		for _, s := range tr.Spans {
			if _, dup := depth[s.ID]; dup {
				t.Fatalf("span %q drawn twice", s.ID)
			}
			depth[s.ID] = s.Depth
			if s.Depth > 0 {
				if d, ok := depth[s.ParentID]; !ok || d != s.Depth-1 {
					t.Fatalf("span %q at depth %d not right after its parent %q", s.ID, s.Depth, s.ParentID)
				}
			}
		}
	})
}
