package server

import (
	"errors"
	"fmt"
	"time"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultShutdownTimeout     = 15 * time.Second
	DefaultMaxRecvMsgSize      = 4 << 20
	DefaultMaxRequestBodyBytes = 1 << 20
	DefaultReadHeaderTimeout   = 5 * time.Second
	DefaultReadTimeout         = 30 * time.Second
	DefaultWriteTimeout        = 30 * time.Second
	DefaultIdleTimeout         = 120 * time.Second
	DefaultRequestTimeout      = 30 * time.Second

	DefaultKeepaliveMinTime = 10 * time.Second
	DefaultKeepaliveTime    = 60 * time.Second
	DefaultKeepaliveTimeout = 20 * time.Second
)

// Config describes one deployable's listeners and limits. For the HTTP
// timeouts, RequestTimeout and MaxRequestBodyBytes, zero means the package
// default and a negative value means "no limit", so that a zero Config is a
// safe production configuration while an operator can still switch a limit
// off explicitly.
type Config struct {
	// Name identifies the service in log lines.
	Name string

	// GRPCAddr and HTTPAddr are the listen addresses, e.g. ":50051" or
	// "127.0.0.1:0". An empty address disables that listener unless a
	// listener is handed over with WithGRPCListener or WithHTTPListener.
	GRPCAddr string
	HTTPAddr string

	// ShutdownTimeout bounds the whole drain: OnShutdown hooks, gRPC
	// GracefulStop and HTTP Shutdown. When it passes, connections are
	// closed forcibly. It should be shorter than the pod's
	// terminationGracePeriodSeconds so the drain ends before SIGKILL. It
	// cannot be switched off: zero or negative means the default.
	ShutdownTimeout time.Duration

	// MaxRecvMsgSize is the largest gRPC message the server accepts;
	// larger ones fail with codes.ResourceExhausted.
	MaxRecvMsgSize int

	// MaxRequestBodyBytes is the largest HTTP request body accepted; larger
	// ones are answered with 413.
	MaxRequestBodyBytes int64

	// ReadHeaderTimeout guards against clients that open connections and
	// trickle headers (slowloris).
	ReadHeaderTimeout time.Duration

	// ReadTimeout and WriteTimeout are net/http's per-connection deadlines.
	// They apply to routes registered with Handle and are cleared for routes
	// registered with HandleStream. On HTTP/1 net/http also cancels the
	// request context when the read deadline passes, so for unary routes
	// the effective handler budget is the smallest of ReadTimeout,
	// WriteTimeout and RequestTimeout.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration

	// IdleTimeout closes keep-alive connections that carry no request.
	IdleTimeout time.Duration

	// RequestTimeout is the context deadline given to handlers registered
	// with Handle. Streaming routes get none.
	RequestTimeout time.Duration

	// Keepalive configures gRPC HTTP/2 keepalive.
	Keepalive Keepalive
}

// Keepalive configures gRPC keepalive, and the TCP keepalive of the
// listeners the server binds; zero fields take the package defaults, and
// negative values are rejected. Agents hold long-lived, mostly idle
// streams through load balancers, so the defaults let clients ping often
// enough to keep NAT and LB state alive, and let the server notice dead peers
// within about a minute and a half rather than gRPC's two hours.
type Keepalive struct {
	// MinTime is the shortest ping interval a client may use before the
	// server answers with GOAWAY ("too_many_pings").
	MinTime time.Duration
	// RejectPingsWithoutStream makes the server close connections that ping
	// while they have no active RPC. By default such pings are permitted,
	// because an agent between streams should not lose its connection.
	RejectPingsWithoutStream bool
	// Time is how long a connection may be silent before the server pings
	// it: an HTTP/2 PING on gRPC connections, and TCP keepalive probes on
	// every connection of a listener the server binds.
	Time time.Duration
	// Timeout is how long the server waits for a ping ack before closing;
	// TCP keepalive gives up on a peer after as long without an answer.
	Timeout time.Duration
	// MaxConnectionIdle, MaxConnectionAge and MaxConnectionAgeGrace are
	// passed to gRPC as is; zero leaves them unlimited. MaxConnectionAge is
	// how clients get rebalanced across replicas behind an L4 balancer.
	MaxConnectionIdle     time.Duration
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
}

// withDefaults returns cfg with zero fields replaced by defaults and negative
// limits replaced by the zero value that net/http and this package read as
// "no limit".
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Name == "" {
		return cfg, errors.New("server: Config.Name is required")
	}
	if cfg.MaxRecvMsgSize < 0 {
		return cfg, fmt.Errorf("server %s: MaxRecvMsgSize %d is negative", cfg.Name, cfg.MaxRecvMsgSize)
	}
	if cfg.MaxRecvMsgSize == 0 {
		cfg.MaxRecvMsgSize = DefaultMaxRecvMsgSize
	}
	switch {
	case cfg.MaxRequestBodyBytes == 0:
		cfg.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	case cfg.MaxRequestBodyBytes < 0:
		cfg.MaxRequestBodyBytes = 0
	}
	if cfg.ShutdownTimeout <= 0 {
		// A drain without a deadline could outlive the pod's grace period
		// and end in SIGKILL, which is worse than a forced close.
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout},
		{&cfg.ReadTimeout, DefaultReadTimeout},
		{&cfg.WriteTimeout, DefaultWriteTimeout},
		{&cfg.IdleTimeout, DefaultIdleTimeout},
		{&cfg.RequestTimeout, DefaultRequestTimeout},
	} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			*d.v = 0
		}
	}

	ka := &cfg.Keepalive
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"MinTime", ka.MinTime},
		{"Time", ka.Time},
		{"Timeout", ka.Timeout},
		{"MaxConnectionIdle", ka.MaxConnectionIdle},
		{"MaxConnectionAge", ka.MaxConnectionAge},
		{"MaxConnectionAgeGrace", ka.MaxConnectionAgeGrace},
	} {
		if f.v < 0 {
			return cfg, fmt.Errorf("server %s: Keepalive.%s %s is negative", cfg.Name, f.name, f.v)
		}
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&ka.MinTime, DefaultKeepaliveMinTime},
		{&ka.Time, DefaultKeepaliveTime},
		{&ka.Timeout, DefaultKeepaliveTimeout},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return cfg, nil
}
