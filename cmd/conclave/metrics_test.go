package main

import (
	"testing"

	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
)

// TestMetricsExportedAtStart: before any traffic, every counter and gauge
// docs/metrics.md lists is on its service's /metrics, at zero where
// nothing has happened, so that an alert such as "no agents connected"
// can fire on a replica that never had one. (Histograms appear with their
// first observation.)
func TestMetricsExportedAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: runs conclave dev")
	}
	t.Parallel()
	_, addrs, _ := devProcess(t, t.TempDir())
	for _, svc := range []struct{ name, row string }{
		{"gateway", "gateway HTTP"},
		{"librarian", "librarian HTTP"},
		{"bridge", "bridge HTTP"},
		{"bus", "bus WebSocket"},
		{"runner", "runner HTTP"},
		{"console", "console HTTP"},
	} {
		t.Run(svc.name, func(t *testing.T) {
			f := metricstest.Scrape(t, "http://"+addrs[svc.row]+"/metrics")
			for _, d := range metricstest.Documented(t, svc.name) {
				if d.Type != "counter" && d.Type != "gauge" {
					continue
				}
				if !f.Has(d.Name) {
					t.Errorf("%s is not on %s's /metrics before any traffic", d.Name, svc.name)
				}
			}
		})
	}
}
