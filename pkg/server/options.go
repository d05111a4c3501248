package server

import (
	"net"
	"net/http"

	"google.golang.org/grpc"
)

// Option customises a Server beyond what Config describes: things that are
// code (interceptors, middleware, handlers, listeners) rather than settings.
type Option func(*options)

type options struct {
	grpcOptions    []grpc.ServerOption
	metrics        http.Handler
	httpMiddleware []func(http.Handler) http.Handler
	grpcListener   net.Listener
	httpListener   net.Listener
}

// WithGRPCOptions appends options to the gRPC server, after the package's own.
// This is how telemetry plugs in (grpc.StatsHandler(otelgrpc.NewServerHandler())).
// Interceptors given with grpc.ChainUnaryInterceptor and
// grpc.ChainStreamInterceptor run inside the built-in logging and panic
// recovery, so a panic in them is recovered too; grpc.UnaryInterceptor and
// grpc.StreamInterceptor would run outside it and should not be used.
func WithGRPCOptions(opts ...grpc.ServerOption) Option {
	return func(o *options) { o.grpcOptions = append(o.grpcOptions, opts...) }
}

// WithMetricsHandler replaces the default promhttp.Handler() served on
// /metrics, e.g. with one bound to a non-default registry or an OpenTelemetry
// Prometheus exporter.
func WithMetricsHandler(h http.Handler) Option {
	return func(o *options) { o.metrics = h }
}

// WithHTTPMiddleware wraps every HTTP route, built-in ones included, e.g. with
// otelhttp.NewMiddleware. Middleware given first is outermost. It runs
// outside panic recovery and the body limit, so it observes the 500 and 413
// responses those produce.
func WithHTTPMiddleware(mw func(http.Handler) http.Handler) Option {
	return func(o *options) { o.httpMiddleware = append(o.httpMiddleware, mw) }
}

// WithGRPCListener serves gRPC on l instead of listening on Config.GRPCAddr.
// Tests and the all-in-one binary use it to bind before constructing the
// server. Run takes ownership of l and closes it on return.
func WithGRPCListener(l net.Listener) Option {
	return func(o *options) { o.grpcListener = l }
}

// WithHTTPListener serves HTTP on l instead of listening on Config.HTTPAddr.
// Run takes ownership of l and closes it on return.
func WithHTTPListener(l net.Listener) Option {
	return func(o *options) { o.httpListener = l }
}
