package telemetry

import (
	"context"
	"net/http"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/conclave-ai/conclave/pkg/telemetry/convention"
)

// GRPCServerOptions instruments a gRPC server: each RPC gets a server span
// whose parent is the trace context sent by the client, and RPC metrics.
// Health checks and reflection are not traced: probes arrive every few
// seconds and would bury real traces. Nor are the methods named in untraced
// (full names, "/package.Service/Method"): meant for streams that live as
// long as a connection, whose one span would say nothing and would hold
// memory for every open stream.
func (p *Provider) GRPCServerOptions(untraced ...string) []grpc.ServerOption {
	opts := append(p.otelgrpcOptions(), otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
		return !strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.") &&
			!strings.HasPrefix(info.FullMethodName, "/grpc.reflection.") &&
			!slices.Contains(untraced, info.FullMethodName)
	}))
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(opts...))}
}

// GRPCDialOptions instruments a gRPC client: each RPC gets a client span
// whose context is sent to the server in the request metadata.
func (p *Provider) GRPCDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(p.otelgrpcOptions()...))}
}

func (p *Provider) otelgrpcOptions() []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(p.tracerProvider),
		otelgrpc.WithMeterProvider(p.meterProvider),
		otelgrpc.WithPropagators(p.propagator),
	}
}

// HTTPHandler instruments an HTTP server handler: each request gets a
// server span named after operation, parented by the request's traceparent
// header.
// Probe and scrape routes (/healthz, /readyz, /metrics) are not traced.
func (p *Provider) HTTPHandler(h http.Handler, operation string) http.Handler {
	opts := append(p.otelhttpOptions(), otelhttp.WithFilter(func(r *http.Request) bool {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			return false
		}
		return true
	}))
	return otelhttp.NewHandler(h, operation, opts...)
}

// HTTPTransport instruments an HTTP client: each request gets a client span
// whose context is sent in the traceparent header. A nil rt means
// http.DefaultTransport.
func (p *Provider) HTTPTransport(rt http.RoundTripper) http.RoundTripper {
	return otelhttp.NewTransport(rt, p.otelhttpOptions()...)
}

func (p *Provider) otelhttpOptions() []otelhttp.Option {
	return []otelhttp.Option{
		otelhttp.WithTracerProvider(p.tracerProvider),
		otelhttp.WithMeterProvider(p.meterProvider),
		otelhttp.WithPropagators(p.propagator),
	}
}

// The environment carrier uses the W3C trace context propagator alone, not
// the provider's, as the message carriers do (package convention): its
// format is fixed (TRACEPARENT and TRACESTATE only).
var w3c propagation.TraceContext

// SQSCarrier adapts SQS message attributes to propagation.TextMapCarrier
// (convention.SQSCarrier).
type SQSCarrier = convention.SQSCarrier

// InjectSQS writes the trace context of ctx into attrs: see
// convention.InjectSQS.
func InjectSQS(ctx context.Context, attrs map[string]types.MessageAttributeValue) {
	convention.InjectSQS(ctx, attrs)
}

// ExtractSQS returns ctx with the remote span context carried by a
// message's attributes: see convention.ExtractSQS.
func ExtractSQS(ctx context.Context, attrs map[string]types.MessageAttributeValue) context.Context {
	return convention.ExtractSQS(ctx, attrs)
}

// InjectEnv returns a copy of env with TRACEPARENT (and TRACESTATE when ctx
// has trace state) set from ctx, replacing any inherited values so a child
// never reports to a stale parent; when ctx has no span context they are just
// removed. env is not modified. Pass os.Environ() or cmd.Environ() to keep
// the rest of the environment: the result becomes exec.Cmd.Env, where a
// non-nil slice replaces the inherited environment.
func InjectEnv(ctx context.Context, env []string) []string {
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	out := make([]string, 0, len(env)+len(c))
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); !isTraceEnv(name) {
			out = append(out, kv)
		}
	}
	// Fields gives a fixed order, which keeps the result deterministic.
	for _, f := range w3c.Fields() {
		if v, ok := c[f]; ok {
			out = append(out, strings.ToUpper(f)+"="+v)
		}
	}
	return out
}

// ExtractEnv returns ctx with the remote span context carried by the
// TRACEPARENT and TRACESTATE entries of environ (as from os.Environ()). As in
// os/exec, a later duplicate entry wins.
func ExtractEnv(ctx context.Context, environ []string) context.Context {
	c := propagation.MapCarrier{}
	for _, kv := range environ {
		if name, value, ok := strings.Cut(kv, "="); ok && isTraceEnv(name) {
			c[strings.ToLower(name)] = value
		}
	}
	return w3c.Extract(ctx, c)
}

func isTraceEnv(name string) bool {
	return name == "TRACEPARENT" || name == "TRACESTATE"
}
