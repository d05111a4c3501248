// Package service wires the coven gateway into a runnable server. It is the
// one entry point shared by cmd/gateway and the all-in-one `conclave dev`.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
)

// Config is the gateway's configuration.
type Config struct {
	GRPCAddr        config.ListenAddr `env:"CONCLAVE_GATEWAY_GRPC_ADDR" default:":50051" help:"gRPC listener for agents (coven.CovenControl) and clients"`
	HTTPAddr        config.ListenAddr `env:"CONCLAVE_GATEWAY_HTTP_ADDR" default:":8080" help:"HTTP listener: REST, health and metrics"`
	ServerID        string            `env:"CONCLAVE_GATEWAY_SERVER_ID" help:"this replica's name in Welcome (default: the host name)"`
	RegisterTimeout time.Duration     `env:"CONCLAVE_GATEWAY_REGISTER_TIMEOUT" default:"10s" help:"how long a new stream may wait before RegisterAgent"`
	AgentTimeout    time.Duration     `env:"CONCLAVE_GATEWAY_AGENT_TIMEOUT" default:"90s" help:"how long a registered agent may stay silent before it is deregistered"`
	ShutdownTimeout time.Duration     `env:"CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT" default:"15s" help:"how long in-flight work may drain on shutdown"`
}

// Validate implements config.Validator.
func (c Config) Validate() error {
	if c.GRPCAddr == "" {
		return fmt.Errorf("CONCLAVE_GATEWAY_GRPC_ADDR: the gateway needs a gRPC listener")
	}
	for key, d := range map[string]time.Duration{
		"CONCLAVE_GATEWAY_REGISTER_TIMEOUT": c.RegisterTimeout,
		"CONCLAVE_GATEWAY_AGENT_TIMEOUT":    c.AgentTimeout,
		"CONCLAVE_GATEWAY_SHUTDOWN_TIMEOUT": c.ShutdownTimeout,
	} {
		if d <= 0 {
			return fmt.Errorf("%s: must be positive, got %s", key, d)
		}
	}
	return nil
}

// Gateway is a configured, not yet running, gateway.
type Gateway struct {
	srv    *server.Server
	agents *agentstream.Service
}

// New builds the gateway's server and services.
func New(cfg Config, logger *slog.Logger, tel *telemetry.Provider, opts ...server.Option) (*Gateway, error) {
	serverID := cfg.ServerID
	if serverID == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("gateway server id: %w", err)
		}
		serverID = host
	}
	opts = append([]server.Option{
		server.WithGRPCOptions(tel.GRPCServerOptions()...),
		server.WithMetricsHandler(tel.MetricsHandler()),
		server.WithHTTPMiddleware(func(h http.Handler) http.Handler { return tel.HTTPHandler(h, "gateway") }),
	}, opts...)
	srv, err := server.New(server.Config{
		Name:            "gateway",
		GRPCAddr:        string(cfg.GRPCAddr),
		HTTPAddr:        string(cfg.HTTPAddr),
		ShutdownTimeout: cfg.ShutdownTimeout,
	}, logger, opts...)
	if err != nil {
		return nil, fmt.Errorf("gateway server: %w", err)
	}
	agents := agentstream.New(agentstream.Options{
		ServerID:        serverID,
		RegisterTimeout: cfg.RegisterTimeout,
		AgentTimeout:    cfg.AgentTimeout,
	}, logger)
	covenpb.RegisterCovenControlServer(srv.GRPC(), agents)
	srv.OnShutdown(func(ctx context.Context) { agents.Shutdown(ctx, "gateway "+serverID+" is shutting down") })
	return &Gateway{srv: srv, agents: agents}, nil
}

// Run serves until ctx is cancelled, then drains.
func (g *Gateway) Run(ctx context.Context) error { return g.srv.Run(ctx) }

// Ready is closed once the listeners are bound.
func (g *Gateway) Ready() <-chan struct{} { return g.srv.Ready() }

// Endpoints lists where the gateway listens, once Ready.
func (g *Gateway) Endpoints() []Endpoint {
	eps := []Endpoint{{Service: "gateway", Protocol: "gRPC: coven.CovenControl (agents)", Address: g.srv.GRPCAddr()}}
	if addr := g.srv.HTTPAddr(); addr != "" {
		eps = append(eps, Endpoint{Service: "gateway", Protocol: "HTTP: /healthz /readyz /metrics", Address: addr})
	}
	return eps
}

// Endpoint is one listening address, for the endpoint table.
type Endpoint struct {
	Service, Protocol, Address string
}
