package server

import (
	"net"
	"net/http"

	"google.golang.org/grpc"

	"github.com/conclave-ai/conclave/pkg/httpguard"
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
	httpError      func(w http.ResponseWriter, code int, message string)
	devHosts       *httpguard.Hosts // WithDevelopmentGuard
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

// WithHTTPErrorWriter makes the errors the server answers by itself on HTTP
// (404 for a path no route has, 405 with Allow for a method no route of the
// path takes, 413 for a body over MaxRequestBodyBytes, 415 for a
// state-changing request that is not JSON, 403 for a Host the development
// guard refuses, 500 for a recovered panic, 503 for a HandleDrained request
// refused while draining) use a service's own
// error body: write is called with the status and a message in place of
// WriteError, so that a service whose protocol fixes its error body answers
// every error in it.
func WithHTTPErrorWriter(write func(w http.ResponseWriter, code int, message string)) Option {
	return func(o *options) { o.httpError = write }
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
