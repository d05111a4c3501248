// Package service is the Librarian for the processes that run pkg/server
// and pkg/telemetry: New serves the handler of internal/handler (the one
// the Lambda serves behind API Gateway) over plain HTTP for
// functions/librarian/cmd/local and `conclave dev`, with Prometheus
// /metrics; NewHandler builds that handler bound to a telemetry.Provider.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/internal/api"
	"github.com/conclave-ai/conclave/functions/librarian/internal/handler"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
)

// Config is the Librarian's configuration.
type Config = handler.Config

// Tables lists the tables the Librarian keeps its state in.
var Tables = handler.Tables

// Queues lists the queues it sends to. Every service declares its queues
// this way, as a function of its config, whether or not their names
// depend on it (the runner's do).
func Queues(Config) []queue.Definition { return handler.Queues }

// EventsQueue is the queue the Librarian publishes its events to.
var EventsQueue = handler.Queues[0]

// Librarian is the handler and the parts other surfaces reach into.
type Librarian = handler.Librarian

// Deps are what the handler runs on.
type Deps struct {
	Store     store.Store
	Queue     queue.Queue
	Logger    *slog.Logger
	Telemetry *telemetry.Provider
	// Now is the clock of decisions and escalation deadlines (nil:
	// time.Now); tests move it forward.
	Now func() time.Time
	// Agents are registered when agents.yaml lacks them (conclave dev's
	// governed agent types; handler.Deps.Agents).
	Agents []string
}

// NewHandler checks cfg, loads the configuration files and builds the
// handler, its metrics and HTTP traces bound to d.Telemetry. It makes no
// network call.
func NewHandler(cfg Config, d Deps) (*Librarian, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hd := handler.Deps{Store: d.Store, Queue: d.Queue, Logger: d.Logger, Now: d.Now, Agents: d.Agents}
	if tel := d.Telemetry; tel != nil {
		hd.Meters = tel.MeterProvider()
		hd.Instrument = func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "librarian") }
	}
	return handler.New(cfg, hd)
}

// Service is the Librarian served over HTTP.
type Service struct {
	srv    *server.Server
	lib    *Librarian
	sweep  time.Duration
	logger *slog.Logger
}

// New checks cfg and serves the handler on cfg.HTTPAddr. The store's
// Tables and the queue's Queues must exist.
func New(cfg Config, d Deps, opts ...server.Option) (*Service, error) {
	lib, err := NewHandler(cfg, d)
	if err != nil {
		return nil, err
	}
	// GET /metrics is Prometheus' for scrapers and the protocol's
	// metrics for a client asking for JSON.
	var prom http.Handler
	if d.Telemetry != nil {
		prom = d.Telemetry.MetricsHandler()
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept"), "application/json") || prom == nil {
			lib.Handler.ServeHTTP(w, r)
			return
		}
		prom.ServeHTTP(w, r)
	})
	opts = append([]server.Option{server.WithMetricsHandler(metrics), server.WithHTTPErrorWriter(api.WriteHTTPError)}, opts...)
	if cfg.AllowUnauthenticated {
		opts = append(opts, server.WithDevelopmentGuard(cfg.AllowedHosts))
	}
	srv, err := server.New(server.Config{
		Name:                "librarian",
		HTTPAddr:            string(cfg.HTTPAddr),
		ShutdownTimeout:     cfg.ShutdownTimeout,
		MaxRequestBodyBytes: lib.Policy.Protocol.Limits.MaxContentSize*2 + 64<<10,
		RequestTimeout:      lib.Policy.Protocol.Timeouts.Response + time.Second,
	}, d.Logger, opts...)
	if err != nil {
		return nil, fmt.Errorf("librarian server: %w", err)
	}
	// The handler applies the content-type rule itself, per path (JSON for
	// the API, forms for the review pages), as it does in the Lambda.
	srv.Handle("/", server.OwnContentTypes(lib.Handler))
	logger := d.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{srv: srv, lib: lib, sweep: cfg.SweepInterval, logger: logger}, nil
}

// Run serves until ctx is cancelled, then drains. Every SweepInterval it
// rejects the escalations past timeouts.escalation that nobody read.
func (s *Service) Run(ctx context.Context) error {
	if s.sweep > 0 {
		sweepCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); s.sweepEvery(sweepCtx) }()
		defer func() { stop(); <-done }()
	}
	return s.srv.Run(ctx)
}

func (s *Service) sweepEvery(ctx context.Context) {
	tick := time.NewTicker(s.sweep)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := s.lib.SweepEscalations(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			// The next tick tries again; a read expires a request meanwhile.
			s.logger.WarnContext(ctx, "escalation sweep failed", "error", err, "rejected", n)
		case n > 0:
			s.logger.InfoContext(ctx, "escalation sweep rejected overdue requests", "rejected", n)
		}
	}
}

// Ready is closed once the listener is bound.
func (s *Service) Ready() <-chan struct{} { return s.srv.Ready() }

// Endpoints lists where the Librarian listens, once Ready.
func (s *Service) Endpoints() []server.Endpoint {
	return []server.Endpoint{{Service: "librarian", Protocol: "HTTP: /agent/* governance API, /reviews, /review pages, /docs, /metrics", Address: s.srv.HTTPAddr()}}
}
