// Package server is the one lifecycle every Conclave deployable shares: how it
// binds its gRPC and HTTP listeners, what it answers to probes and scrapes, how
// it survives a panicking handler, and how it drains when Kubernetes (or a
// developer's Ctrl-C) asks it to stop.
//
// It exists so that the gateway, bus, runner and librarian do not each grow
// their own subtly different answers to those questions. A load balancer must
// see the same health semantics from every service, an operator must find the
// same /healthz, /readyz and /metrics everywhere, and a rolling deploy must not
// cut in-flight requests or agent streams on any of them.
//
// A main function builds a Server with New, registers gRPC services on GRPC()
// and HTTP routes with Handle, HandleStream and HandleDrained, and calls Run with a context
// that signal.NotifyContext cancels on SIGINT or SIGTERM. Run returns once
// every listener has drained or the drain deadline has forced them closed.
//
// The package deliberately depends on nothing else in Conclave: telemetry is
// plugged in by the caller through WithGRPCOptions (stats handlers) and
// WithHTTPMiddleware (otelhttp), so that this package stays usable by every
// binary, including the all-in-one `conclave dev`.
package server
