package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Jaeger is a running Jaeger all-in-one (collector, query and agent in one
// process, in-memory storage), every one of its ports on a free loopback port.
type Jaeger struct {
	// OTLPEndpoint is the host:port of the OTLP gRPC receiver, for
	// otlptracegrpc.WithEndpoint (with WithInsecure) or, as
	// "http://"+OTLPEndpoint, OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string
	// OTLPHTTPEndpoint is the host:port of the OTLP HTTP receiver.
	OTLPHTTPEndpoint string
	// QueryURL is the base URL of the query service: its UI and /api.
	QueryURL string

	c *Component
}

// Stop kills Jaeger and waits for it to exit.
func (j *Jaeger) Stop() {
	if j != nil {
		j.c.Stop()
	}
}

// Provider is a telemetry provider for service whose spans reach this
// Jaeger as each one ends, unbatched, so that a trace is complete there
// without waiting. It is shut down when the test ends.
func (j *Jaeger) Provider(t testing.TB, service string) *telemetry.Provider {
	t.Helper()
	exp, err := otlptracegrpc.New(context.Background(), otlptracegrpc.WithEndpoint(j.OTLPEndpoint), otlptracegrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	p, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: service, SpanProcessors: []sdktrace.SpanProcessor{sdktrace.NewSimpleSpanProcessor(exp)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

// PostTraced POSTs the JSON body to url from a span, name, of a "client"
// service exporting to j, the span's context in the request's traceparent
// header: the start of a trace a test then follows through the services.
// It ends the span once the response is read, and returns the response,
// its body and the trace's id.
func (j *Jaeger) PostTraced(t testing.TB, ctx context.Context, name, url, body string) (*http.Response, []byte, string) {
	t.Helper()
	ctx, span := j.Provider(t, "client").TracerProvider().Tracer("client").Start(ctx, name)
	defer span.End()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, respBody := Do(t, req)
	return resp, respBody, span.SpanContext().TraceID().String()
}

// Output is what Jaeger has printed so far, for diagnosing failures.
func (j *Jaeger) Output() string { return j.c.Output() }

// jaegerPorts lists all-in-one v1.62's listening flags: every one is set, so
// none of its fixed default ports (4317, 16686, 14269, ...) is ever bound.
var jaegerPorts = []struct {
	flag string
	udp  bool
}{
	{"--collector.otlp.grpc.host-port", false},
	{"--collector.otlp.http.host-port", false},
	{"--query.http-server.host-port", false},
	{"--admin.http.host-port", false},
	{"--query.grpc-server.host-port", false},
	{"--collector.grpc-server.host-port", false},
	{"--collector.http-server.host-port", false},
	{"--collector.zipkin.host-port", false},
	{"--http-server.host-port", false}, // the agent's sampling config server
	{"--processor.jaeger-compact.server-host-port", true},
	{"--processor.jaeger-binary.server-host-port", true},
	{"--processor.zipkin-compact.server-host-port", true},
}

// JaegerFor is StartJaeger for one test: it fails the test when Jaeger
// cannot start, and stops it when the test ends. Call it before starting
// what exports to it, so that it stops after them (cleanups run last
// first) and receives the spans they export while they shut down.
func JaegerFor(t testing.TB) *Jaeger {
	t.Helper()
	j, err := StartJaeger(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Stop)
	return j
}

// StartJaeger starts the pinned Jaeger all-in-one from .cache/bin, building
// it first with scripts/build-test-tools.sh when it is missing or
// tools/jaeger changed (see Kube about that build and ctx), and waits until
// it reports itself ready, for at most 2 minutes.
//
// Jaeger binds a dozen ports, each picked free a moment before; when another
// process takes one first Jaeger exits, and it is started again on new ports.
func StartJaeger(ctx context.Context) (*Jaeger, error) {
	bin, err := ToolBinaries(ctx, "jaeger", "jaeger-all-in-one")
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		j, err := startJaeger(ctx, bin)
		if err == nil || !errors.Is(err, ErrExited) || attempt == 3 {
			return j, err
		}
	}
}

func startJaeger(ctx context.Context, bin string) (*Jaeger, error) {
	addrs := make(map[string]string, len(jaegerPorts))
	args := []any{
		Env{
			"SPAN_STORAGE_TYPE=memory",
			// Jaeger traces itself to OTEL_EXPORTER_OTLP_ENDPOINT (default
			// localhost:4317): keep those traces out of every Jaeger,
			// this one and whatever the environment points at.
			"OTEL_TRACES_SAMPLER=always_off",
		},
		"--log-level=warn",
	}
	for _, p := range jaegerPorts {
		port, err := freePort(p.udp)
		if err != nil {
			return nil, err
		}
		addrs[p.flag] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		args = append(args, p.flag+"="+addrs[p.flag])
	}
	otlp := addrs["--collector.otlp.grpc.host-port"]
	args = append(args, Env{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + otlp})

	// Start waits for the admin port, which serves the health check.
	_, adminPort, _ := net.SplitHostPort(addrs["--admin.http.host-port"])
	port, _ := strconv.Atoi(adminPort)
	c, err := Start(ctx, "jaeger", port, filepath.Join(bin, "jaeger-all-in-one"), args...)
	if err != nil {
		return nil, err
	}
	j := &Jaeger{
		OTLPEndpoint:     otlp,
		OTLPHTTPEndpoint: addrs["--collector.otlp.http.host-port"],
		QueryURL:         "http://" + addrs["--query.http-server.host-port"],
		c:                c,
	}
	if err := j.waitReady(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return j, nil
}

// waitReady polls the admin health check until it answers 200, which
// all-in-one does once the collector, its receivers and the query service
// all serve, then checks that the OTLP and query ports take connections.
func (j *Jaeger) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		last = j.health(ctx)
		if last == "" {
			break
		}
		select {
		case <-j.c.done:
			return fmt.Errorf("testenv: jaeger %w (it was not yet ready):\n%s", ErrExited, j.Output())
		case <-ctx.Done():
			return fmt.Errorf("testenv: jaeger not ready (%s): %w\n%s", last, ctx.Err(), j.Output())
		case <-time.After(50 * time.Millisecond):
		}
	}
	u, _ := url.Parse(j.QueryURL)
	for _, addr := range []string{j.OTLPEndpoint, u.Host} {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("testenv: jaeger ready but %s refuses connections: %w\n%s", addr, err, j.Output())
		}
		conn.Close()
	}
	return nil
}

// health returns "" when the admin health check says the server is
// available, else what it said.
func (j *Jaeger) health(ctx context.Context) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.c.Endpoint+"/", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("health %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return ""
}

// JaegerTrace is a trace as Jaeger's query API returns it.
type JaegerTrace struct {
	// TraceID is the 32 hex digit W3C trace id.
	TraceID string
	Spans   []JaegerSpan
}

// JaegerSpan is one span of a JaegerTrace.
type JaegerSpan struct {
	// SpanID is the 16 hex digit span id.
	SpanID        string
	OperationName string
	// ServiceName is the service.name of the resource that sent the span.
	ServiceName string
	// ParentSpanID is the span id of the CHILD_OF reference within the same
	// trace (the OTLP parent), or "" for a root span.
	ParentSpanID string
	// References are all its references: CHILD_OF for the parent,
	// FOLLOWS_FROM for span links.
	References []JaegerReference
	// Tags are the span's attributes and status (otel.status_code,
	// span.kind, error, ...), by key.
	Tags      map[string]any
	StartTime time.Time
	Duration  time.Duration
}

// JaegerReference is a reference from one span to another.
type JaegerReference struct {
	// RefType is CHILD_OF or FOLLOWS_FROM.
	RefType string
	TraceID string
	SpanID  string
}

// Span returns the first span with the operation name, or nil.
func (t *JaegerTrace) Span(operationName string) *JaegerSpan {
	for i := range t.Spans {
		if t.Spans[i].OperationName == operationName {
			return &t.Spans[i]
		}
	}
	return nil
}

// Trace fetches a trace by its hex id from the query API, polling until the
// trace has appeared (spans arrive asynchronously) or ctx ends.
func (j *Jaeger) Trace(ctx context.Context, traceID string) (*JaegerTrace, error) {
	return j.WaitTrace(ctx, traceID, 1)
}

// WaitTrace is Trace, polling until the trace has at least spans spans, for
// a trace whose spans come from several processes and may arrive apart.
func (j *Jaeger) WaitTrace(ctx context.Context, traceID string, spans int) (*JaegerTrace, error) {
	return j.WaitTraceFunc(ctx, traceID, func(t *JaegerTrace) string {
		if len(t.Spans) < spans {
			return fmt.Sprintf("trace has %d spans, want %d", len(t.Spans), spans)
		}
		return ""
	})
}

// WaitTraceFunc is Trace, polling until complete, given the trace as it
// stands, returns "" (the trace is as wanted) or ctx ends. Otherwise
// complete says what is missing, and on ctx's end the error says it too,
// and the trace as it last stood is returned with it (nil if it was never
// found).
func (j *Jaeger) WaitTraceFunc(ctx context.Context, traceID string, complete func(*JaegerTrace) string) (*JaegerTrace, error) {
	var (
		last  string
		found *JaegerTrace
	)
	for {
		t, err := j.fetchTrace(ctx, traceID)
		switch {
		case err != nil:
			last = err.Error()
		case t == nil:
			last = "trace not found"
		default:
			found = t
			if last = complete(t); last == "" {
				return t, nil
			}
		}
		select {
		case <-ctx.Done():
			return found, fmt.Errorf("testenv: jaeger trace %s: %s: %w", traceID, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fetchTrace does one GET /api/traces/{id}; a nil trace means not found.
func (j *Jaeger) fetchTrace(ctx context.Context, traceID string) (*JaegerTrace, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/traces/"+url.PathEscape(traceID), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("query answered %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var r struct {
		Data []struct {
			TraceID string `json:"traceID"`
			Spans   []struct {
				TraceID       string `json:"traceID"`
				SpanID        string `json:"spanID"`
				OperationName string `json:"operationName"`
				References    []struct {
					RefType string `json:"refType"`
					TraceID string `json:"traceID"`
					SpanID  string `json:"spanID"`
				} `json:"references"`
				StartTime int64 `json:"startTime"` // microseconds since the epoch
				Duration  int64 `json:"duration"`  // microseconds
				Tags      []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
				ProcessID string `json:"processID"`
			} `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decode trace: %w: %s", err, body)
	}
	if len(r.Data) == 0 {
		return nil, nil
	}
	if len(r.Data) > 1 {
		return nil, fmt.Errorf("query returned %d traces for one id", len(r.Data))
	}
	d := r.Data[0]
	t := &JaegerTrace{TraceID: padID(d.TraceID, 32)}
	for _, s := range d.Spans {
		js := JaegerSpan{
			SpanID:        padID(s.SpanID, 16),
			OperationName: s.OperationName,
			ServiceName:   d.Processes[s.ProcessID].ServiceName,
			Tags:          make(map[string]any, len(s.Tags)),
			StartTime:     time.UnixMicro(s.StartTime),
			Duration:      time.Duration(s.Duration) * time.Microsecond,
		}
		for _, ref := range s.References {
			r := JaegerReference{RefType: ref.RefType, TraceID: padID(ref.TraceID, 32), SpanID: padID(ref.SpanID, 16)}
			js.References = append(js.References, r)
			if r.RefType == "CHILD_OF" && r.TraceID == t.TraceID && js.ParentSpanID == "" {
				js.ParentSpanID = r.SpanID
			}
		}
		for _, tag := range s.Tags {
			js.Tags[tag.Key] = tag.Value
		}
		t.Spans = append(t.Spans, js)
	}
	return t, nil
}

// padID restores the leading zeros Jaeger's JSON drops from ids.
func padID(id string, width int) string {
	if len(id) >= width {
		return id
	}
	return strings.Repeat("0", width-len(id)) + id
}

// freePort returns a loopback port, TCP or UDP, that was free a moment ago.
func freePort(udp bool) (int, error) {
	if !udp {
		return FreePort()
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}
