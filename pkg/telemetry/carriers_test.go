package telemetry_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/test/bufconn"

	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// TestCarriersRoundTrip sends trace context across each kind of hop and
// checks the receiving span joins the sender's trace as its child.
func TestCarriersRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// hop performs one call across the carrier. Every span it starts must
		// have ended when it returns.
		hop                      func(t *testing.T, p *telemetry.Provider)
		senderKind, receiverKind trace.SpanKind
	}{
		{name: "grpc", hop: grpcHop, senderKind: trace.SpanKindClient, receiverKind: trace.SpanKindServer},
		{name: "http", hop: httpHop, senderKind: trace.SpanKindClient, receiverKind: trace.SpanKindServer},
		{name: "sqs", hop: sqsHop, senderKind: trace.SpanKindProducer, receiverKind: trace.SpanKindConsumer},
		{name: "env", hop: envHop, senderKind: trace.SpanKindClient, receiverKind: trace.SpanKindServer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, rec := newRecordingProvider(t)
			tt.hop(t, p)

			spans := rec.Ended()
			sender := onlySpan(t, spans, tt.senderKind)
			receiver := onlySpan(t, spans, tt.receiverKind)
			if got, want := receiver.SpanContext().TraceID(), sender.SpanContext().TraceID(); got != want {
				t.Errorf("receiver trace id %s, want sender's %s", got, want)
			}
			if got, want := receiver.Parent().SpanID(), sender.SpanContext().SpanID(); got != want {
				t.Errorf("receiver parent span id %s, want sender span id %s", got, want)
			}
			if !receiver.Parent().IsRemote() {
				t.Error("receiver parent is not marked remote")
			}
		})
	}
}

func onlySpan(t *testing.T, spans []sdktrace.ReadOnlySpan, kind trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanKind() == kind {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("got %d ended spans of kind %s, want 1 (all spans: %d)", len(found), kind, len(spans))
	}
	return found[0]
}

type emptyService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (emptyService) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

func grpcHop(t *testing.T, p *telemetry.Provider) {
	lis := bufconn.Listen(1 << 20)
	// WaitForHandlers makes GracefulStop wait until the server span has
	// ended, so the test needs no sleeping or polling.
	srv := grpc.NewServer(append(p.GRPCServerOptions(), grpc.WaitForHandlers(true))...)
	testgrpc.RegisterTestServiceServer(srv, emptyService{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()

	conn, err := grpc.NewClient("passthrough:///bufconn", append(p.GRPCDialOptions(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	_, err = testgrpc.NewTestServiceClient(conn).EmptyCall(context.Background(), &testgrpc.Empty{})
	if cerr := conn.Close(); cerr != nil {
		t.Errorf("close conn: %v", cerr)
	}
	srv.GracefulStop()
	if serr := <-served; serr != nil {
		t.Errorf("serve: %v", serr)
	}
	if err != nil {
		t.Fatalf("EmptyCall: %v", err)
	}
}

func httpHop(t *testing.T, p *telemetry.Provider) {
	srv := httptest.NewServer(p.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}), "test"))
	// Close waits for the handler, and so for the server span to end.
	defer srv.Close()

	client := &http.Client{Transport: p.HTTPTransport(srv.Client().Transport)}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	// Closing the body ends the client span.
	if err := resp.Body.Close(); err != nil {
		t.Errorf("close body: %v", err)
	}
}

func sqsHop(t *testing.T, p *telemetry.Provider) {
	tracer := p.TracerProvider().Tracer("test")
	ctx, send := tracer.Start(context.Background(), "send", trace.WithSpanKind(trace.SpanKindProducer))
	attrs := map[string]types.MessageAttributeValue{}
	telemetry.InjectSQS(ctx, attrs)
	send.End()

	if v := attrs["traceparent"]; aws.ToString(v.DataType) != "String" {
		t.Errorf("traceparent DataType %q, want String", aws.ToString(v.DataType))
	}
	_, receive := tracer.Start(telemetry.ExtractSQS(context.Background(), attrs), "receive", trace.WithSpanKind(trace.SpanKindConsumer))
	receive.End()
}

func envHop(t *testing.T, p *telemetry.Provider) {
	tracer := p.TracerProvider().Tracer("test")
	ctx, spawn := tracer.Start(context.Background(), "spawn", trace.WithSpanKind(trace.SpanKindClient))
	env := telemetry.InjectEnv(ctx, []string{"PATH=/bin"})
	spawn.End()

	if !slices.Contains(env, "PATH=/bin") {
		t.Errorf("InjectEnv dropped PATH: %q", env)
	}
	_, child := tracer.Start(telemetry.ExtractEnv(context.Background(), env), "child", trace.WithSpanKind(trace.SpanKindServer))
	child.End()
}

func TestInjectSQS(t *testing.T) {
	t.Parallel()
	remote := remoteSpanContext(t)
	noState := remote.WithTraceState(trace.TraceState{})
	stale := types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String("00-stale")}
	tests := []struct {
		name  string
		sc    trace.SpanContext
		attrs map[string]types.MessageAttributeValue
		want  map[string]string // attribute name -> string value
	}{
		{
			name: "traceparent and tracestate",
			sc:   remote,
			attrs: map[string]types.MessageAttributeValue{
				"kind": {DataType: aws.String("String"), StringValue: aws.String("task")},
			},
			want: map[string]string{
				"kind":        "task",
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				"tracestate":  "conclave=1",
			},
		},
		{
			name: "no trace state",
			sc:   noState,
			want: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		},
		{
			name:  "stale values replaced",
			sc:    noState,
			attrs: map[string]types.MessageAttributeValue{"traceparent": stale, "tracestate": stale},
			want:  map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		},
		{
			name:  "no span removes stale values",
			attrs: map[string]types.MessageAttributeValue{"traceparent": stale},
			want:  map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			attrs := map[string]types.MessageAttributeValue{}
			for k, v := range tt.attrs {
				attrs[k] = v
			}
			telemetry.InjectSQS(trace.ContextWithRemoteSpanContext(context.Background(), tt.sc), attrs)

			got := map[string]string{}
			for k, v := range attrs {
				if aws.ToString(v.DataType) != "String" {
					t.Errorf("attribute %s DataType %q, want String", k, aws.ToString(v.DataType))
				}
				got[k] = aws.ToString(v.StringValue)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("attributes %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestExtractSQS(t *testing.T) {
	t.Parallel()
	str := func(s string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
	}
	tests := []struct {
		name      string
		attrs     map[string]types.MessageAttributeValue
		wantValid bool
	}{
		{name: "valid", attrs: map[string]types.MessageAttributeValue{"traceparent": str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}, wantValid: true},
		{name: "nil map"},
		{name: "malformed", attrs: map[string]types.MessageAttributeValue{"traceparent": str("00-nothex-01")}},
		{name: "binary value", attrs: map[string]types.MessageAttributeValue{"traceparent": {DataType: aws.String("Binary"), BinaryValue: []byte("x")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := trace.SpanContextFromContext(telemetry.ExtractSQS(context.Background(), tt.attrs))
			if sc.IsValid() != tt.wantValid {
				t.Errorf("extracted span context valid = %v, want %v", sc.IsValid(), tt.wantValid)
			}
		})
	}
}

func TestInjectEnv(t *testing.T) {
	t.Parallel()
	remote := remoteSpanContext(t)
	const parent = "TRACEPARENT=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		name string
		ctx  context.Context
		env  []string
		want []string
	}{
		{
			name: "adds",
			ctx:  trace.ContextWithRemoteSpanContext(context.Background(), remote),
			env:  []string{"HOME=/root"},
			want: []string{"HOME=/root", parent, "TRACESTATE=conclave=1"},
		},
		{
			name: "replaces inherited",
			ctx:  trace.ContextWithRemoteSpanContext(context.Background(), remote.WithTraceState(trace.TraceState{})),
			env:  []string{"TRACEPARENT=00-old", "HOME=/root", "TRACESTATE=old=1"},
			want: []string{"HOME=/root", parent},
		},
		{
			name: "no span drops inherited",
			ctx:  context.Background(),
			env:  []string{"TRACEPARENT=00-old", "HOME=/root"},
			want: []string{"HOME=/root"},
		},
		{
			name: "similar names kept",
			ctx:  context.Background(),
			env:  []string{"TRACEPARENT_X=1", "traceparent=lower"},
			want: []string{"TRACEPARENT_X=1", "traceparent=lower"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			orig := slices.Clone(tt.env)
			got := telemetry.InjectEnv(tt.ctx, tt.env)
			if !slices.Equal(got, tt.want) {
				t.Errorf("InjectEnv = %q, want %q", got, tt.want)
			}
			if !slices.Equal(tt.env, orig) {
				t.Errorf("InjectEnv modified its input: %q, was %q", tt.env, orig)
			}
		})
	}
}

func TestExtractEnv(t *testing.T) {
	t.Parallel()
	const (
		first  = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		second = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	)
	tests := []struct {
		name      string
		environ   []string
		wantTrace string // empty: no valid span context
		wantState string
	}{
		{name: "traceparent", environ: []string{"TRACEPARENT=" + first}, wantTrace: "4bf92f3577b34da6a3ce929d0e0e4736"},
		{name: "with tracestate", environ: []string{"TRACEPARENT=" + first, "TRACESTATE=conclave=1"}, wantTrace: "4bf92f3577b34da6a3ce929d0e0e4736", wantState: "conclave=1"},
		{name: "later duplicate wins", environ: []string{"TRACEPARENT=" + first, "TRACEPARENT=" + second}, wantTrace: "0af7651916cd43dd8448eb211c80319c"},
		{name: "absent", environ: []string{"HOME=/root"}},
		{name: "malformed", environ: []string{"TRACEPARENT=garbage"}},
		{name: "lower case is not ours", environ: []string{"traceparent=" + first}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc := trace.SpanContextFromContext(telemetry.ExtractEnv(context.Background(), tt.environ))
			if tt.wantTrace == "" {
				if sc.IsValid() {
					t.Errorf("extracted valid span context %s, want none", sc.TraceID())
				}
				return
			}
			if got := sc.TraceID().String(); got != tt.wantTrace {
				t.Errorf("trace id %s, want %s", got, tt.wantTrace)
			}
			if got := sc.TraceState().String(); got != tt.wantState {
				t.Errorf("trace state %q, want %q", got, tt.wantState)
			}
		})
	}
}

// BenchmarkSQS measures the per-message cost of carrying trace context.
func BenchmarkSQS(b *testing.B) {
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remoteSpanContext(b))
	b.Run("inject", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			telemetry.InjectSQS(ctx, make(map[string]types.MessageAttributeValue, 2))
		}
	})
	b.Run("extract", func(b *testing.B) {
		attrs := map[string]types.MessageAttributeValue{}
		telemetry.InjectSQS(ctx, attrs)
		b.ReportAllocs()
		for b.Loop() {
			telemetry.ExtractSQS(context.Background(), attrs)
		}
	})
}

// TestProbesAreNotTraced checks that health checks and scrapes make no
// server spans, so probes every few seconds do not bury real traces.
func TestProbesAreNotTraced(t *testing.T) {
	t.Parallel()
	p, rec := newRecordingProvider(t)

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(append(p.GRPCServerOptions(), grpc.WaitForHandlers(true))...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	srv.GracefulStop()

	hs := httptest.NewServer(p.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), "probe"))
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	hs.Close()

	if spans := rec.Ended(); len(spans) != 0 {
		t.Fatalf("probes made %d spans, first %q", len(spans), spans[0].Name())
	}
}

// TestUntracedMethods checks that a method named untraced makes no server
// span while the others still do.
func TestUntracedMethods(t *testing.T) {
	t.Parallel()
	p, rec := newRecordingProvider(t)

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(append(p.GRPCServerOptions(testgrpc.TestService_EmptyCall_FullMethodName), grpc.WaitForHandlers(true))...)
	testgrpc.RegisterTestServiceServer(srv, emptyService{})
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := testgrpc.NewTestServiceClient(conn)
	if _, err := client.EmptyCall(context.Background(), &testgrpc.Empty{}); err != nil {
		t.Fatal(err)
	}
	// UnaryCall is unimplemented; its error still makes a server span.
	_, _ = client.UnaryCall(context.Background(), &testgrpc.SimpleRequest{})
	_ = conn.Close()
	srv.GracefulStop()

	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	if want := []string{"grpc.testing.TestService/UnaryCall"}; !slices.Equal(names, want) {
		t.Fatalf("server spans %q, want %q", names, want)
	}
}
