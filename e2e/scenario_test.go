package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// step is one step of the scenario (docs/e2e.md says what each proves).
type step struct {
	name string
	run  func(r *stepRun)
}

var steps = []step{
	{"1_coven_agent_through_the_gateway", stepCovenAgent},
	{"2_default_handler_launches_an_acp_agent", stepDefaultHandler},
	{"3_task_progress_on_the_bus", stepTaskProgress},
	{"4_librarian_decisions_on_the_bus", stepLibrarian},
	{"5_bridge_tool_over_mcp_and_as_a_oneshot_agent", stepBridgeTool},
	{"6_dead_letter_and_redrive", stepDeadLetter},
	{"7_governed_agent_asks_the_librarian", stepGoverned},
	{"8_one_request_through_all_five", stepFrontDoor},
	{"9_a2a_client_through_the_gateway", stepA2A},
}

// stepTimeout bounds one step, its waits for Jaeger included.
const stepTimeout = 3 * time.Minute

// scenario is what the steps of one shape share: the shape, and the test's
// own telemetry, whose spans are the roots of the steps' traces.
type scenario struct {
	sh     *shape
	tel    *telemetry.Provider
	tracer trace.Tracer
	// http is the client every step's HTTP calls go through: it sends the
	// current span's context in traceparent.
	http *http.Client
	// widest is the trace of the steps with spans from the most services,
	// for the console to draw.
	widest *testenv.JaegerTrace
}

// runScenario runs every step on sh, in order, each a subtest. A step that
// fails does not stop the next: each sets up what it needs.
func runScenario(t *testing.T, sh *shape) {
	tel := jaeger.Provider(t, "e2e-"+sh.name)
	sc := &scenario{sh: sh, tel: tel, tracer: tel.TracerProvider().Tracer("github.com/conclave-ai/conclave/e2e"),
		http: &http.Client{Transport: tel.HTTPTransport(nil)}}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := &stepRun{scenario: sc, t: t, name: st.name}
			ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
			defer cancel()
			r.ctx = ctx
			r.markLogs()
			defer r.report()
			st.run(r)
		})
	}
	if sh.console != "" {
		t.Run("the_console_draws_a_trace", func(t *testing.T) {
			if sc.widest == nil {
				t.Fatal("no step's trace was found in Jaeger: there is none to draw")
			}
			ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
			defer cancel()
			consoleDrawsTrace(t, ctx, sh, sc.widest)
		})
	}
}

// stepRun is one step being run.
type stepRun struct {
	*scenario
	t    *testing.T
	name string
	ctx  context.Context
	// traces are the ids of the traces the step started, for the report.
	traces []string
	// logStart is each log's length when the step began.
	logStart map[*logSource]int
}

// root starts a root span of the step, in the test's own service: each of
// the step's requests is made in its context, so that it is the root of
// the trace the step checks.
func (r *stepRun) root(name string) (context.Context, trace.Span) {
	ctx, span := r.tracer.Start(r.ctx, name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient))
	r.traces = append(r.traces, span.SpanContext().TraceID().String())
	r.t.Logf("trace %s: %s", span.SpanContext().TraceID(), name)
	return ctx, span
}

// hop is something a step's trace must hold: a span of a service, and,
// when op is set, one whose operation name begins with op.
type hop struct {
	service, op string
}

// in is any span of service.
func in(service string) hop { return hop{service: service} }

// spanOf is a span of service whose operation begins with op.
func spanOf(service, op string) hop { return hop{service: service, op: op} }

func (h hop) String() string {
	if h.op == "" {
		return "spans of " + h.service
	}
	return fmt.Sprintf("a span %q of %s", h.op, h.service)
}

// expectTrace waits until the trace of root (ended by now) is in Jaeger
// with root itself and every one of hops, and fails the step if it never
// is. It returns the trace.
func (r *stepRun) expectTrace(root trace.Span, hops ...hop) *testenv.JaegerTrace {
	r.t.Helper()
	traceID, rootID := root.SpanContext().TraceID().String(), root.SpanContext().SpanID().String()
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	tr, err := jaeger.WaitTraceFunc(ctx, traceID, func(t *testenv.JaegerTrace) string {
		var missing []string
		if !slices.ContainsFunc(t.Spans, func(s testenv.JaegerSpan) bool { return s.SpanID == rootID }) {
			missing = append(missing, "the step's own root span")
		}
		for _, h := range hops {
			if !slices.ContainsFunc(t.Spans, func(s testenv.JaegerSpan) bool {
				return r.sh.serviceOf(s) == h.service && strings.HasPrefix(s.OperationName, h.op)
			}) {
				missing = append(missing, h.String())
			}
		}
		if len(missing) > 0 {
			return fmt.Sprintf("the trace lacks %s (it has spans of %v)", strings.Join(missing, ", "), r.sh.services(t))
		}
		return ""
	})
	if err != nil {
		r.t.Fatalf("%v; its spans:\n%s", err, r.sh.describe(tr))
	}
	r.t.Logf("trace %s: %d spans from %v (in Jaeger after %s)", traceID, len(tr.Spans), r.sh.services(tr), time.Since(start).Round(time.Millisecond))
	if r.widest == nil || len(r.sh.services(tr)) > len(r.sh.services(r.widest)) {
		r.widest = tr
	}
	return tr
}

// markLogs records where each log stands as the step begins.
func (r *stepRun) markLogs() {
	r.logStart = map[*logSource]int{}
	for _, l := range r.sh.logs {
		r.logStart[l] = len(l.read())
	}
}

// reportLines bounds how much of each log a failure report shows: the
// lines before the step began (context), and the step's own (the last
// ones).
const (
	reportLinesBefore = 10
	reportLinesDuring = 200
)

// report prints, when the step failed, the step, its trace ids, and each
// service's log around the step: a few lines from before it began and
// what was logged during it.
func (r *stepRun) report() {
	if !r.t.Failed() {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== step %s of shape %s failed\n", r.name, r.sh.name)
	fmt.Fprintf(&b, "trace ids: %s (%s/trace/<id>)\n", strings.Join(r.traces, " "), jaeger.QueryURL)
	for _, l := range r.sh.logs {
		all := l.read()
		start := min(r.logStart[l], len(all))
		before := lastLines(all[:start], reportLinesBefore)
		during := lastLines(all[start:], reportLinesDuring)
		fmt.Fprintf(&b, "--- log of %s (%d lines before the step, then the step's own)\n%s", l.name, reportLinesBefore, before)
		fmt.Fprintf(&b, "--- %s: the step begins\n%s", l.name, during)
	}
	r.t.Log(b.String())
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[... %d lines ...]\n", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "")
}

// unique is a short random suffix, so that the names a step makes (topics,
// task ids, paths) are its own.
func unique() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
