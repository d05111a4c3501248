package clientapi

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// A call made in process (REST, A2A) does not pass gRPC's stats handler,
// which names a gRPC call's span. These interceptors, first in the
// in-process chain, give it the same span name (the full method) under
// the caller's span, so a trace shows which client API call a REST or A2A
// request became, as it does for a gRPC client.
var tracer = otel.Tracer("github.com/conclave-ai/conclave/services/gateway/internal/clientapi")

func rpcAttributes(fullMethod string) []attribute.KeyValue {
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	return []attribute.KeyValue{
		attribute.String("rpc.system", "grpc"),
		attribute.String("rpc.service", service),
		attribute.String("rpc.method", method),
		attribute.Bool("conclave.in_process", true),
	}
}

func spanName(fullMethod string) string { return strings.TrimPrefix(fullMethod, "/") }

func endSpan(span trace.Span, err error) {
	if err != nil {
		st, _ := status.FromError(err)
		span.SetAttributes(attribute.String("rpc.grpc.status_code", st.Code().String()))
		span.SetStatus(otelcodes.Error, st.Message())
	}
	span.End()
}

func traceUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, span := tracer.Start(ctx, spanName(info.FullMethod), trace.WithAttributes(rpcAttributes(info.FullMethod)...))
	resp, err := h(ctx, req)
	endSpan(span, err)
	return resp, err
}

func traceStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, span := tracer.Start(ss.Context(), spanName(info.FullMethod), trace.WithAttributes(rpcAttributes(info.FullMethod)...))
	err := h(srv, &tracedStream{ServerStream: ss, ctx: ctx})
	endSpan(span, err)
	return err
}

// tracedStream is ss with the span's context.
type tracedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *tracedStream) Context() context.Context { return s.ctx }
