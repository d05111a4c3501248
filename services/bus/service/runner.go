package service

import (
	"crypto/tls"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bus/internal/runnerlaunch"
)

// RunnerLauncher returns the default handler's Launcher over the runner's
// gRPC API at cfg.RunnerAddr, traced through tel, and the connection to
// close once the bus has stopped. Without CONCLAVE_BUS_RUNNER_ADDR it
// returns a nil Launcher: the bus then has no default handler. extra dial
// options come after the bus's own (conclave dev dials its runner once it
// is listening).
func RunnerLauncher(cfg Config, tel *telemetry.Provider, extra ...grpc.DialOption) (Launcher, io.Closer, error) {
	if cfg.RunnerAddr == "" {
		return nil, io.NopCloser(nil), nil
	}
	creds := insecure.NewCredentials()
	if cfg.RunnerTLS {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	opts := append(tel.GRPCDialOptions(), grpc.WithTransportCredentials(creds))
	conn, err := grpc.NewClient("passthrough:///"+cfg.RunnerAddr, append(opts, extra...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("CONCLAVE_BUS_RUNNER_ADDR: %w", err)
	}
	return runnerlaunch.New(conn, cfg.RunnerAddr, cfg.RunnerAgentType, cfg.RunnerToken), conn, nil
}
