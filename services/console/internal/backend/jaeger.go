package backend

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"time"
)

// Jaeger is Jaeger's query API (the JSON API its UI reads), for the
// console's own view of a trace.
type Jaeger struct{ *Client }

// Trace is one trace as the console shows it: its spans in tree order
// (each after its parent, siblings by start time), with their depth.
type Trace struct {
	ID       string
	Start    time.Time
	Duration time.Duration
	Spans    []Span
	// Services are the services with spans in the trace, by first span,
	// with how many each has.
	Services []ServiceSpans
	// Truncated is how many spans were left out past MaxTraceSpans.
	Truncated int
}

// Span is one span of a Trace.
type Span struct {
	ID        string
	ParentID  string
	Service   string
	Operation string
	Kind      string
	// Offset is the span's start from the trace's start.
	Offset   time.Duration
	Duration time.Duration
	Depth    int
	Error    bool
	// StatusMessage is the span's error description, when it has one.
	StatusMessage string
}

// ServiceSpans counts a service's spans in a trace.
type ServiceSpans struct {
	Service string
	Spans   int
}

// MaxTraceSpans bounds the spans a trace view shows; a larger trace is
// cut (the rest are in Jaeger), which Trace.Truncated counts.
const MaxTraceSpans = 2000

// jaegerTrace is the part of Jaeger's query API answer the console reads
// (GET /api/traces/{id}: {"data": [trace], "errors": ...}).
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		StartTime int64 `json:"startTime"` // microseconds since the epoch
		Duration  int64 `json:"duration"`  // microseconds
		Tags      []struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		} `json:"tags"`
		ProcessID string `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// Trace reads a trace by id (GET /api/traces/{id}). A trace Jaeger does
// not have (yet: spans arrive in batches) is a Rejected error, 404.
func (j Jaeger) Trace(ctx context.Context, id string) (*Trace, error) {
	var out struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := j.Do(ctx, "", "GET", "/api/traces/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, err
	}
	if len(out.Data) == 0 {
		return nil, &Error{Service: j.Service, Kind: Rejected, Status: 404, Message: "trace not found"}
	}
	t, err := ParseJaegerTrace(out.Data[0])
	if err != nil {
		return nil, &Error{Service: j.Service, Kind: Unavailable, Status: 200, Message: "a trace the console cannot read: " + err.Error(), Err: err}
	}
	return t, nil
}

// ParseJaegerTrace reads one trace of Jaeger's query API. Whatever the
// spans' references, every span is shown once: a span whose parent is
// missing (not arrived, or another trace's) is a root, and a cycle of
// references is cut.
func ParseJaegerTrace(raw []byte) (*Trace, error) {
	var jt jaegerTrace
	if err := json.Unmarshal(raw, &jt); err != nil {
		return nil, err
	}
	if len(jt.Spans) == 0 {
		return nil, fmt.Errorf("trace %q has no spans", jt.TraceID)
	}
	spans := make([]Span, 0, min(len(jt.Spans), MaxTraceSpans))
	starts := make([]int64, 0, cap(spans))
	byID := make(map[string]int, cap(spans))
	first, last := int64(0), int64(0)
	truncated := 0
	for _, js := range jt.Spans {
		if len(spans) == MaxTraceSpans {
			truncated++
			continue
		}
		if _, dup := byID[js.SpanID]; dup || js.SpanID == "" {
			continue
		}
		s := Span{ID: js.SpanID, Operation: js.OperationName, Service: jt.Processes[js.ProcessID].ServiceName,
			Duration: time.Duration(max(js.Duration, 0)) * time.Microsecond}
		for _, ref := range js.References {
			if ref.RefType == "CHILD_OF" {
				s.ParentID = ref.SpanID
				break
			}
		}
		for _, tag := range js.Tags {
			switch tag.Key {
			case "span.kind":
				_ = json.Unmarshal(tag.Value, &s.Kind)
			case "error":
				var b bool
				if json.Unmarshal(tag.Value, &b) == nil && b {
					s.Error = true
				}
			case "otel.status_code":
				var code string
				if json.Unmarshal(tag.Value, &code) == nil && code == "ERROR" {
					s.Error = true
				}
			case "otel.status_description":
				_ = json.Unmarshal(tag.Value, &s.StatusMessage)
			}
		}
		if len(spans) == 0 || js.StartTime < first {
			first = js.StartTime
		}
		last = max(last, js.StartTime+max(js.Duration, 0))
		byID[s.ID] = len(spans)
		spans = append(spans, s)
		starts = append(starts, js.StartTime)
	}
	if len(spans) == 0 {
		return nil, fmt.Errorf("trace %q has no span with an id", jt.TraceID)
	}
	children := make(map[string][]int, len(spans))
	var roots []int
	for i, s := range spans {
		if _, ok := byID[s.ParentID]; ok && s.ParentID != s.ID {
			children[s.ParentID] = append(children[s.ParentID], i)
		} else {
			roots = append(roots, i)
		}
	}
	byStart := func(a, b int) int { return cmp.Compare(starts[a], starts[b]) }
	t := &Trace{ID: jt.TraceID, Start: time.UnixMicro(first).UTC(), Duration: time.Duration(last-first) * time.Microsecond,
		Spans: make([]Span, 0, len(spans)), Truncated: truncated}
	placed := make([]bool, len(spans))
	var walk func(i, depth int)
	walk = func(i, depth int) {
		if placed[i] {
			return
		}
		placed[i] = true
		s := spans[i]
		s.Depth, s.Offset = depth, time.Duration(starts[i]-first)*time.Microsecond
		t.Spans = append(t.Spans, s)
		kids := children[s.ID]
		slices.SortStableFunc(kids, byStart)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	slices.SortStableFunc(roots, byStart)
	for _, r := range roots {
		walk(r, 0)
	}
	// Spans in a cycle of references have no root: each starts a tree of
	// its own, in start order.
	rest := make([]int, 0)
	for i := range spans {
		if !placed[i] {
			rest = append(rest, i)
		}
	}
	slices.SortStableFunc(rest, byStart)
	for _, i := range rest {
		walk(i, 0)
	}
	seen := map[string]int{}
	for _, s := range t.Spans {
		if _, ok := seen[s.Service]; !ok {
			seen[s.Service] = len(t.Services)
			t.Services = append(t.Services, ServiceSpans{Service: s.Service})
		}
		t.Services[seen[s.Service]].Spans++
	}
	return t, nil
}
