package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/conclave-ai/conclave/pkg/httpguard"
)

// ErrDraining is the cancellation cause of the context handed to streaming
// HTTP routes when the server starts closing its listeners. A WebSocket
// handler can check context.Cause(ctx) against it to send "going away"
// (1001) rather than treat the end as a client disconnect.
var ErrDraining = errors.New("server is draining")

// ErrDrainDeadline is the cancellation cause of the context handed to
// HandleDrained routes when ShutdownTimeout passes with the request still
// running.
var ErrDrainDeadline = errors.New("drain deadline passed")

// Server runs one deployable's gRPC and HTTP listeners with shared health,
// readiness, metrics, panic recovery and graceful shutdown. Create it with
// New, register services and routes, then call Run once.
type Server struct {
	cfg    Config
	logger *slog.Logger

	grpcServer *grpc.Server
	health     *health.Server
	mux        *http.ServeMux
	httpServer *http.Server
	// writeError answers the HTTP errors the server writes itself.
	writeError func(w http.ResponseWriter, code int, message string)
	// devHosts, under WithDevelopmentGuard, are the Host names answered.
	devHosts *httpguard.Hosts

	// Listeners are handed over by options or bound by Run, which owns
	// them either way.
	grpcListener net.Listener
	httpListener net.Listener
	grpcEnabled  bool
	httpEnabled  bool

	// streams is cancelled with ErrDraining once the listeners are closing
	// and no drained request is running, ending streaming HTTP routes and
	// gRPC health Watch calls: neither ever finishes on its own, so waiting
	// for them would only use up the drain deadline.
	streams     context.Context
	stopStreams context.CancelCauseFunc
	// drainExpired is cancelled with ErrDrainDeadline when the drain
	// deadline passes, ending the drained requests still running.
	drainExpired context.Context
	expireDrain  context.CancelCauseFunc

	// drainedMu guards the count of running HandleDrained requests and the
	// draining flag's transition, so that no drained request can start
	// after shutdown has begun waiting for them.
	drainedMu      sync.Mutex
	drainedRunning int
	drainedIdle    chan struct{} // closed when drainedRunning drops to 0 during the drain

	running  atomic.Bool
	draining atomic.Bool
	ready    chan struct{}

	mu       sync.Mutex
	grpcAddr string
	httpAddr string
	checks   []readinessCheck
	hooks    []func(context.Context)
}

type readinessCheck struct {
	name  string
	check func(context.Context) error
}

// New builds a Server from cfg. It binds nothing and starts nothing; Run does.
// At least one of gRPC and HTTP must be enabled, through an address in cfg or
// a listener option.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		return nil, fmt.Errorf("server %s: logger is nil", cfg.Name)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}

	s := &Server{
		cfg:          cfg,
		logger:       logger.With("server", cfg.Name),
		health:       health.NewServer(),
		mux:          http.NewServeMux(),
		writeError:   WriteError,
		devHosts:     o.devHosts,
		grpcListener: o.grpcListener,
		httpListener: o.httpListener,
		grpcEnabled:  cfg.GRPCAddr != "" || o.grpcListener != nil,
		httpEnabled:  cfg.HTTPAddr != "" || o.httpListener != nil,
		ready:        make(chan struct{}),
	}
	if o.httpError != nil {
		s.writeError = o.httpError
	}
	if !s.grpcEnabled && !s.httpEnabled {
		return nil, fmt.Errorf("server %s: neither a gRPC nor an HTTP listener is configured", cfg.Name)
	}
	s.streams, s.stopStreams = context.WithCancelCause(context.Background())
	s.drainExpired, s.expireDrain = context.WithCancelCause(context.Background())

	// The overall status stays NOT_SERVING until Run has bound the listeners,
	// so a balancer never routes to a server that is still wiring itself up.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)

	// The gRPC server exists even without a gRPC listener, so registration
	// code in a main need not branch on configuration.
	s.grpcServer = grpc.NewServer(append(s.grpcServerOptions(), o.grpcOptions...)...)
	healthpb.RegisterHealthServer(s.grpcServer, &drainingHealth{Server: s.health, drained: s.streams})
	reflection.Register(s.grpcServer)

	metrics := o.metrics
	if metrics == nil {
		metrics = promhttp.Handler()
	}
	s.Handle("GET /healthz", http.HandlerFunc(s.serveHealthz))
	s.Handle("GET /readyz", http.HandlerFunc(s.serveReadyz))
	s.Handle("GET /metrics", metrics)

	handler := s.httpCore(s.routes())
	for _, mw := range slices.Backward(o.httpMiddleware) {
		handler = mw(handler)
	}
	s.httpServer = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Endpoint is one listening address of a deployable, as `conclave dev`
// prints it in its endpoint table: the service, where it listens, and what
// it serves there.
type Endpoint struct {
	Service, Protocol, Address string
}

// GRPC returns the gRPC server for service registration. Register before Run.
func (s *Server) GRPC() *grpc.Server { return s.grpcServer }

// GRPCAddr returns the address the gRPC listener is bound to, or "" before
// Ready is closed or when gRPC is disabled.
func (s *Server) GRPCAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grpcAddr
}

// HTTPAddr returns the address the HTTP listener is bound to, or "" before
// Ready is closed or when HTTP is disabled.
func (s *Server) HTTPAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.httpAddr
}

// Ready is closed once Run has bound every listener, so GRPCAddr and HTTPAddr
// are final. It is never closed if binding fails; wait on Run's result too.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// SetServingStatus sets the gRPC health status of one service (e.g.
// "coven.CovenControl"). Once draining has begun, updates are ignored so that
// nothing can report SERVING again.
func (s *Server) SetServingStatus(service string, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(service, st)
}

// AddReadinessCheck adds a check that /readyz runs on every probe; the server
// is ready only while all of them return nil. Checks run concurrently under
// the probe's request context and must be cheap (a ping, not a query). It
// panics on an empty or duplicate name, as http.ServeMux does on a bad
// pattern, because either is a programming error.
func (s *Server) AddReadinessCheck(name string, check func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == "" || slices.ContainsFunc(s.checks, func(c readinessCheck) bool { return c.name == name }) {
		panic(fmt.Sprintf("server %s: readiness check name %q is empty or already registered", s.cfg.Name, name))
	}
	s.checks = append(s.checks, readinessCheck{name: name, check: check})
}

// OnShutdown registers a hook that runs when draining begins, after health
// has turned NOT_SERVING and before the listeners stop, e.g. to tell
// connected agents to reconnect elsewhere. Hooks run one after another in
// registration order; ctx carries the drain deadline, and time they use is
// taken from the listeners' drain.
func (s *Server) OnShutdown(hook func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks = append(s.hooks, hook)
}

// Run binds the listeners, serves until ctx is cancelled, then drains. It
// returns nil after a clean drain, an error naming the address when a
// listener cannot be bound or fails, and an error wrapping
// context.DeadlineExceeded when ShutdownTimeout forced connections closed.
// Run may be called only once.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("server %s: Run called more than once", s.cfg.Name)
	}
	if err := s.listen(); err != nil {
		return err
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.logger.InfoContext(ctx, "serving", "grpc_addr", s.GRPCAddr(), "http_addr", s.HTTPAddr())
	close(s.ready)

	serveErrs := make(chan error, 2)
	serving := 0
	if s.grpcListener != nil {
		serving++
		go func() { serveErrs <- s.serveGRPC() }()
	}
	if s.httpListener != nil {
		serving++
		go func() { serveErrs <- s.serveHTTP() }()
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-serveErrs:
		serving--
		s.logger.ErrorContext(ctx, "listener failed, shutting down", "err", serveErr)
	}
	// The drain must outlive ctx, which is already cancelled, while keeping
	// its values (trace and log attributes) for the hooks.
	shutdownErr := s.shutdown(context.WithoutCancel(ctx))
	for ; serving > 0; serving-- {
		if err := <-serveErrs; err != nil && serveErr == nil {
			serveErr = err
		}
	}
	return errors.Join(serveErr, shutdownErr)
}

// listen binds whichever listeners were not handed over. On failure it closes
// every listener, including handed-over ones, since Run owns them.
func (s *Server) listen() (err error) {
	defer func() {
		if err != nil {
			for _, l := range []net.Listener{s.grpcListener, s.httpListener} {
				if l != nil {
					_ = l.Close()
				}
			}
		}
	}()
	if s.grpcListener == nil {
		if err := s.checkLoopback("gRPC", s.cfg.GRPCAddr); err != nil {
			return err
		}
	}
	if s.httpListener == nil {
		if err := s.checkLoopback("HTTP", s.cfg.HTTPAddr); err != nil {
			return err
		}
	}
	if s.grpcEnabled && s.grpcListener == nil {
		if s.grpcListener, err = listenTCP(s.cfg.GRPCAddr, s.cfg.Keepalive); err != nil {
			return fmt.Errorf("server %s: gRPC listener on %s: %w", s.cfg.Name, s.cfg.GRPCAddr, err)
		}
	}
	if s.httpEnabled && s.httpListener == nil {
		if s.httpListener, err = listenTCP(s.cfg.HTTPAddr, s.cfg.Keepalive); err != nil {
			return fmt.Errorf("server %s: HTTP listener on %s: %w", s.cfg.Name, s.cfg.HTTPAddr, err)
		}
	}
	if err := s.checkBound(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grpcListener != nil {
		s.grpcAddr = s.grpcListener.Addr().String()
	}
	if s.httpListener != nil {
		s.httpAddr = s.httpListener.Addr().String()
	}
	return nil
}

func (s *Server) serveGRPC() error {
	err := s.grpcServer.Serve(s.grpcListener)
	// ErrServerStopped means the drain began before Serve did: not a failure.
	if err == nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("server %s: gRPC on %s: %w", s.cfg.Name, s.GRPCAddr(), err)
}

func (s *Server) serveHTTP() error {
	err := s.httpServer.Serve(s.httpListener)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("server %s: HTTP on %s: %w", s.cfg.Name, s.HTTPAddr(), err)
}

// shutdown drains in the order load balancers need: first stop advertising
// (health, readiness), then let hooks move long-lived clients away, then stop
// accepting and wait for in-flight work, and only at the deadline cut it.
func (s *Server) shutdown(ctx context.Context) error {
	s.drainedMu.Lock()
	s.draining.Store(true)
	s.drainedMu.Unlock()
	s.health.Shutdown()
	s.logger.InfoContext(ctx, "draining", "timeout", s.cfg.ShutdownTimeout)

	ctx, cancel := context.WithTimeout(ctx, s.cfg.ShutdownTimeout)
	defer cancel()

	s.mu.Lock()
	hooks := slices.Clone(s.hooks)
	s.mu.Unlock()
	for _, hook := range hooks {
		s.runHook(ctx, hook)
	}

	var (
		wg     sync.WaitGroup
		forced atomic.Bool
		errMu  sync.Mutex
		errs   []error
	)
	// gRPC's GracefulStop waits for health Watch calls, which end with the
	// streams below; it runs on its own meanwhile, so that the listeners
	// close before the wait for drained requests.
	if s.grpcListener != nil {
		wg.Go(func() {
			stopped := make(chan struct{})
			go func() {
				s.grpcServer.GracefulStop()
				close(stopped)
			}()
			select {
			case <-stopped:
			case <-ctx.Done():
				forced.Store(true)
				s.grpcServer.Stop()
				<-stopped
			}
		})
	}
	if s.httpListener != nil {
		wg.Go(func() {
			err := s.httpServer.Shutdown(ctx)
			if ctx.Err() != nil {
				forced.Store(true)
				s.expireDrain(ErrDrainDeadline)
				err = s.httpServer.Close()
			}
			if err != nil {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("server %s: HTTP shutdown: %w", s.cfg.Name, err))
				errMu.Unlock()
			}
		})
	}
	// Streams carry what drained requests send their clients, so they end
	// only once those requests are done (at once when there are none).
	s.awaitDrained(ctx)
	s.stopStreams(ErrDraining)
	wg.Wait()

	if forced.Load() {
		s.logger.WarnContext(ctx, "drain deadline passed, remaining connections closed")
		errs = append(errs, fmt.Errorf("server %s: drain did not finish within %s, remaining connections were closed: %w",
			s.cfg.Name, s.cfg.ShutdownTimeout, context.DeadlineExceeded))
	} else {
		s.logger.InfoContext(ctx, "stopped")
	}
	return errors.Join(errs...)
}

// startDrained admits a request of a HandleDrained route, unless the server
// is draining.
func (s *Server) startDrained() bool {
	s.drainedMu.Lock()
	defer s.drainedMu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.drainedRunning++
	return true
}

func (s *Server) endDrained() {
	s.drainedMu.Lock()
	defer s.drainedMu.Unlock()
	s.drainedRunning--
	if s.drainedRunning == 0 && s.drainedIdle != nil {
		close(s.drainedIdle)
		s.drainedIdle = nil
	}
}

// awaitDrained waits until no HandleDrained request runs, or until ctx (the
// drain deadline) ends, when it cancels the ones left.
func (s *Server) awaitDrained(ctx context.Context) {
	s.drainedMu.Lock()
	if s.drainedRunning == 0 {
		s.drainedMu.Unlock()
		return
	}
	idle := make(chan struct{})
	s.drainedIdle = idle
	s.drainedMu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
		s.expireDrain(ErrDrainDeadline)
	}
}

// runHook isolates a hook's panic so that one faulty hook cannot stop the
// listeners from draining.
func (s *Server) runHook(ctx context.Context, hook func(context.Context)) {
	defer func() {
		if v := recover(); v != nil {
			s.logger.ErrorContext(ctx, "panic in shutdown hook", "panic", v, "stack", string(debug.Stack()))
		}
	}()
	hook(ctx)
}

// AdvertisedAddr turns a listener address into one other hosts can dial, for
// replicas that forward to each other: a wildcard host becomes this host's
// name.
func AdvertisedAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil || (host != "" && host != "::" && host != "0.0.0.0") {
		return listen
	}
	name, err := os.Hostname()
	if err != nil {
		return listen
	}
	return net.JoinHostPort(name, port)
}
