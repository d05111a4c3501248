package toolset

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/govern"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bridge/internal/agentconfig"
	"github.com/conclave-ai/conclave/services/bridge/internal/tools"
)

// governance gives r's governed tools what they ask the Librarian with,
// and returns the watcher of its decisions (nil without a bus). A
// config.yaml with governed tools needs CONCLAVE_BRIDGE_LIBRARIAN_URL.
func governance(cfg Settings, agents *agentconfig.Config, r *tools.Runner, logger *slog.Logger, tel *telemetry.Provider) (*govern.Watcher, error) {
	var (
		metrics govern.Metrics
		tp      trace.TracerProvider
	)
	if tel != nil {
		// Made with no governed tool too, so that every documented
		// metric is on /metrics from the start (at zero).
		m, err := tools.NewGovernanceMetrics(tel.Meter("bridge"))
		if err != nil {
			return nil, err
		}
		metrics, tp = m, tel.TracerProvider()
	}
	var governed []string
	for _, a := range agents.Agents {
		if a.Governed {
			governed = append(governed, a.Name)
		}
	}
	if len(governed) == 0 {
		return nil, nil
	}
	if cfg.LibrarianURL == "" {
		return nil, fmt.Errorf("CONCLAVE_BRIDGE_LIBRARIAN_URL: tools %v are governed (governed: true); set the Librarian's URL", governed)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	if tel != nil {
		hc.Transport = tel.HTTPTransport(nil)
	}
	token := cfg.LibrarianToken
	client := govern.NewClient(func() string { return cfg.LibrarianURL }, func(string) string { return token }, hc)
	var watcher *govern.Watcher
	if cfg.BusURL != "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		watcher = govern.NewWatcher(govern.WatcherOptions{URL: func() string { return cfg.BusURL }, Token: cfg.BusToken,
			ClientID: "bridge-" + hex.EncodeToString(b), Status: client.Status, Logger: logger})
	}
	gov := govern.NewGovernor(client, watcher, metrics, tp, logger)
	r.SetGovernance(tools.Governance{Governor: gov, AgentID: cfg.LibrarianAgent})
	return watcher, nil
}
