// Package bridgetest runs the bridge in process for tests and benchmarks:
// its HTTP server on a loopback port, and an MCP client session of it.
package bridgetest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bridge/service"
)

// Bridge is a bridge serving HTTP in process.
type Bridge struct {
	// Base is the server's URL, http://127.0.0.1:PORT.
	Base string
	// Shutdown stops the bridge as SIGTERM does and returns Run's result;
	// later calls return the same result. A bridge the test does not stop
	// stops when the test ends, and an error from its Run fails the test.
	Shutdown func() error
}

// MCP is the bridge's MCP endpoint.
func (b *Bridge) MCP() string { return b.Base + service.MCPPath }

// Serve runs the bridge with cfg, with telemetry for service, on a
// loopback port (cfg.HTTPAddr is not used), and returns once it is ready.
func Serve(tb testing.TB, cfg service.Config, serviceName string) *Bridge {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: serviceName})
	if err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	b, err := service.New(cfg, service.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Telemetry: tel}, server.WithHTTPListener(l))
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	stop := sync.OnceValue(func() error {
		// Spare client connections would otherwise hold the drain.
		if tr, ok := http.DefaultTransport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
		cancel()
		return <-done
	})
	var stoppedByTest atomic.Bool
	tb.Cleanup(func() {
		// A test that stops the bridge itself checks Run's result.
		if err := stop(); err != nil && !stoppedByTest.Load() {
			tb.Errorf("bridge Run: %v", err)
		}
		_ = tel.Shutdown(context.Background())
	})
	<-b.Ready()
	return &Bridge{Base: "http://" + l.Addr().String(), Shutdown: func() error {
		stoppedByTest.Store(true)
		return stop()
	}}
}

// Connect opens an MCP client session named client with the Go SDK's
// streamable HTTP client at url, sending token as a bearer token; it
// closes when the test ends.
func Connect(tb testing.TB, url, token, client string, opts *mcp.ClientOptions) *mcp.ClientSession {
	tb.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: client, Version: "1"}, opts)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: testenv.Bearer{Token: token, Next: http.DefaultTransport}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cs.Close() })
	return cs
}
