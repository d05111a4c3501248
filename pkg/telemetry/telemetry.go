// Package telemetry wires OpenTelemetry tracing and metrics for every
// Conclave process and carries W3C trace context across each kind of hop the
// system has: gRPC, HTTP, SQS messages and child processes.
//
// The goal is one trace per request in Jaeger, so the package keeps every hop
// on the same propagation format (W3C traceparent/tracestate) instead of
// leaving each service to pick its own. Tracing is opt-in per deployment:
// without an OTLP endpoint the tracer provider is a no-op that records
// nothing, yet the propagators still forward incoming trace context, so a
// service with tracing off does not break the traces of its neighbours.
// Metrics are always served in Prometheus format because scraping needs no
// collector, and are also pushed over OTLP when an endpoint is configured.
//
// New builds a Provider without touching OpenTelemetry's globals, which keeps
// tests independent; Setup does the same and then installs it globally, as
// production needs for libraries that only consult the globals.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conclave-ai/conclave/pkg/config"
)

// Config describes where telemetry goes. It is plain data: callers read the
// environment (OTEL_EXPORTER_OTLP_ENDPOINT and friends) and pass values in, so
// that tests never depend on the process environment.
type Config struct {
	// ServiceName is required; it becomes service.name, the key Jaeger
	// groups traces by.
	ServiceName    string
	ServiceVersion string
	// OTLPEndpoint is the collector's gRPC address, either "host:port" or a
	// URL such as "http://otel-collector:4317" (the form
	// OTEL_EXPORTER_OTLP_ENDPOINT usually takes). Empty turns tracing off and
	// OTLP metric pushing off.
	OTLPEndpoint string
	// OTLPInsecure disables TLS to the collector. An "http://" endpoint
	// implies it.
	OTLPInsecure bool
	// SampleRatio is the fraction of new root traces recorded, in [0, 1].
	// Zero means 1: an endpoint that receives nothing is almost always a
	// configuration mistake. Traces started elsewhere follow the caller's
	// sampling decision so a trace is never recorded only in part.
	SampleRatio float64
	// SpanProcessors receive every recorded span in addition to the OTLP
	// exporter, and turn tracing on even without an endpoint. Tests use it
	// with tracetest.SpanRecorder to assert on the spans a flow produces.
	SpanProcessors []sdktrace.SpanProcessor
}

// Provider owns the tracer and meter providers of a process. Its methods
// hand out instrumentation bound to these providers rather than to the
// OpenTelemetry globals.
type Provider struct {
	tracerProvider trace.TracerProvider
	meterProvider  *sdkmetric.MeterProvider
	propagator     propagation.TextMapPropagator
	metricsHandler http.Handler
	// shutdowns run in order: traces first, so spans recorded while metrics
	// flush are not lost.
	shutdowns []func(context.Context) error

	shutdownOnce sync.Once
	shutdownErr  error
}

// Setup builds a Provider with New and installs its tracer provider, meter
// provider and propagator as the OpenTelemetry globals.
func Setup(ctx context.Context, cfg Config) (*Provider, error) {
	p, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	otel.SetTracerProvider(p.tracerProvider)
	otel.SetMeterProvider(p.MeterProvider())
	otel.SetTextMapPropagator(p.propagator)
	return p, nil
}

// New builds a Provider from cfg without touching OpenTelemetry's globals.
// Exporters connect lazily, so New succeeds while the collector is down.
// The caller must call Shutdown to flush buffered telemetry.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.ServiceName == "" {
		return nil, errors.New("telemetry: ServiceName is required")
	}
	if cfg.SampleRatio < 0 || cfg.SampleRatio > 1 {
		return nil, fmt.Errorf("telemetry: SampleRatio %v outside [0, 1]", cfg.SampleRatio)
	}
	var target *otlpTarget
	if cfg.OTLPEndpoint != "" {
		t, err := parseEndpoint(cfg.OTLPEndpoint, cfg.OTLPInsecure)
		if err != nil {
			return nil, err
		}
		target = &t
	}

	attrs := []attribute.KeyValue{semconv.ServiceName(cfg.ServiceName)}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, semconv.ServiceVersion(cfg.ServiceVersion))
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, attrs...)

	p := &Provider{
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
	tp, err := newTracerProvider(ctx, cfg, res, target)
	if err != nil {
		return nil, err
	}
	p.tracerProvider = tp
	if sdk, ok := tp.(*sdktrace.TracerProvider); ok {
		p.shutdowns = append(p.shutdowns, sdk.Shutdown)
	}

	mp, handler, err := newMeterProvider(ctx, res, target)
	if err != nil {
		return nil, errors.Join(err, p.Shutdown(ctx))
	}
	p.meterProvider = mp
	p.metricsHandler = handler
	p.shutdowns = append(p.shutdowns, mp.Shutdown)
	return p, nil
}

func newTracerProvider(ctx context.Context, cfg Config, res *resource.Resource, target *otlpTarget) (trace.TracerProvider, error) {
	if target == nil && len(cfg.SpanProcessors) == 0 {
		return noop.NewTracerProvider(), nil
	}
	ratio := cfg.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	}
	if target != nil {
		exOpts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(target.endpoint)}
		if target.insecure {
			exOpts = append(exOpts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, exOpts...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: create OTLP trace exporter: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	for _, sp := range cfg.SpanProcessors {
		opts = append(opts, sdktrace.WithSpanProcessor(sp))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

func newMeterProvider(ctx context.Context, res *resource.Resource, target *otlpTarget) (*sdkmetric.MeterProvider, http.Handler, error) {
	// A registry of our own, not prometheus.DefaultRegisterer, so that
	// providers built by parallel tests do not collide.
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	promExp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: create Prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(promExp)}
	if target != nil {
		exOpts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(target.endpoint)}
		if target.insecure {
			exOpts = append(exOpts, otlpmetricgrpc.WithInsecure())
		}
		exp, err := otlpmetricgrpc.New(ctx, exOpts...)
		if err != nil {
			return nil, nil, fmt.Errorf("telemetry: create OTLP metric exporter: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	return sdkmetric.NewMeterProvider(opts...), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

type otlpTarget struct {
	endpoint string // host:port
	insecure bool
}

// parseEndpoint accepts both forms OTLP endpoints come in. It is stricter
// than the exporters' own URL option, which silently falls back to
// localhost on a malformed URL.
func parseEndpoint(raw string, insecure bool) (otlpTarget, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		// Not a URL with a scheme: treat it as host:port.
		return otlpTarget{endpoint: raw, insecure: insecure}, nil
	}
	switch u.Scheme {
	case "http":
		return otlpTarget{endpoint: u.Host, insecure: true}, nil
	case "https":
		return otlpTarget{endpoint: u.Host, insecure: insecure}, nil
	default:
		return otlpTarget{}, fmt.Errorf("telemetry: OTLP endpoint %q: unsupported scheme %q", raw, u.Scheme)
	}
}

// TracerProvider returns the provider's tracer provider: a no-op one when
// tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tracerProvider }

// MeterProvider returns the provider's meter provider. Its instruments are
// always visible through MetricsHandler.
func (p *Provider) MeterProvider() metric.MeterProvider {
	return zeroStartProvider{p.meterProvider}
}

// MetricsHandler serves the provider's metrics, plus Go runtime and process
// metrics, in the Prometheus exposition format.
func (p *Provider) MetricsHandler() http.Handler { return p.metricsHandler }

// Shutdown flushes buffered spans and metrics and releases exporters. It is
// safe to call more than once; later calls return the first call's result.
// ctx bounds the flush: with the collector unreachable, Shutdown returns when
// ctx ends.
func (p *Provider) Shutdown(ctx context.Context) error {
	p.shutdownOnce.Do(func() {
		var errs []error
		for _, f := range p.shutdowns {
			if err := f(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			p.shutdownErr = fmt.Errorf("telemetry: shutdown: %w", err)
		}
	})
	return p.shutdownErr
}

// Start sets up a deployable's tracing and metrics from its common settings
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_INSECURE) with Setup. The
// returned stop flushes them within a bound of its own, so it can run after
// a drain that used up the caller's context.
func Start(ctx context.Context, c config.Common, service, version string) (*Provider, func(), error) {
	tel, err := Setup(ctx, Config{
		ServiceName: service, ServiceVersion: version,
		OTLPEndpoint: c.OTLPEndpoint, OTLPInsecure: c.OTLPInsecure,
	})
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}
	return tel, stop, nil
}
