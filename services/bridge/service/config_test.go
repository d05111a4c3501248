package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bridge/service"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	valid := service.Config{ConfigFile: "c.yaml", HTTPAddr: ":8083", Tokens: []string{"bridge-token-0123456789"}, ShutdownTimeout: time.Second,
		ProgressInterval: time.Second, MaxRequestBytes: 4096, Rate: 1, Burst: 1, MaxRunning: 1}
	if err := valid.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		mutate func(*service.Config)
		key    string
	}{
		{"no config", func(c *service.Config) { c.ConfigFile = "" }, "CONCLAVE_BRIDGE_CONFIG"},
		{"no tokens", func(c *service.Config) { c.Tokens = nil }, "CONCLAVE_BRIDGE_TOKENS"},
		{"empty token", func(c *service.Config) { c.Tokens = []string{"bridge-token-0123456789", ""} }, "CONCLAVE_BRIDGE_TOKENS"},
		{"15-character token", func(c *service.Config) { c.Tokens = []string{"fifteen-chars-x"} }, "CONCLAVE_BRIDGE_TOKENS"},
		{"shutdown", func(c *service.Config) { c.ShutdownTimeout = 0 }, "CONCLAVE_BRIDGE_SHUTDOWN_TIMEOUT"},
		{"progress", func(c *service.Config) { c.ProgressInterval = -time.Second }, "CONCLAVE_BRIDGE_PROGRESS_INTERVAL"},
		{"body", func(c *service.Config) { c.MaxRequestBytes = 10 }, "CONCLAVE_BRIDGE_MAX_REQUEST_BYTES"},
		{"rate", func(c *service.Config) { c.Rate = 0 }, "CONCLAVE_BRIDGE_RATE"},
		{"burst", func(c *service.Config) { c.Burst = 0 }, "CONCLAVE_BRIDGE_BURST"},
		{"max running", func(c *service.Config) { c.MaxRunning = 0 }, "CONCLAVE_BRIDGE_MAX_RUNNING"},
	} {
		c := valid
		tt.mutate(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tt.key+":") {
			t.Errorf("%s: Validate = %v, want an error naming %s", tt.name, err, tt.key)
		}
	}
	open := valid
	open.Tokens, open.AllowUnauthenticated, open.HTTPAddr = nil, true, "127.0.0.1:8083"
	if err := open.Validate(); err != nil {
		t.Fatalf("unauthenticated development setup: %v", err)
	}
	// Without tokens, loopback only.
	for _, addr := range []config.ListenAddr{":8083", "0.0.0.0:8083", "[::]:8083"} {
		open.HTTPAddr = addr
		if err := open.Validate(); err == nil || !strings.HasPrefix(err.Error(), "CONCLAVE_BRIDGE_HTTP_ADDR:") {
			t.Errorf("unauthenticated on %s: Validate = %v, want an error naming CONCLAVE_BRIDGE_HTTP_ADDR", addr, err)
		}
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	t.Parallel()
	var cfg struct{ Bridge service.Config }
	env := map[string]string{"CONCLAVE_BRIDGE_TOKENS": "bridge-token-a-0123456789,bridge-token-b-0123456789", "CONCLAVE_BRIDGE_CONFIG": "/etc/bridge.yaml"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := config.Load(context.Background(), &cfg, "bridge", nil, lookup, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	b := cfg.Bridge
	if b.HTTPAddr != ":8083" || b.ConfigFile != "/etc/bridge.yaml" || len(b.Tokens) != 2 || b.ProgressInterval != 5*time.Second || b.MaxRunning != 16 || b.AllowUnauthenticated {
		t.Fatalf("config = %+v", b)
	}
}

// TestNewChecksConfig: New refuses a Config that Validate refuses, before
// it reads config.yaml or uses its Deps, with the error naming the setting.
func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	cfg := service.Config{ConfigFile: "missing.yaml", HTTPAddr: "127.0.0.1:0", Tokens: []string{"bridge-token-0123456789"}, ShutdownTimeout: time.Second,
		ProgressInterval: time.Second, MaxRequestBytes: 4096, Rate: 1, Burst: 1}
	if _, err := service.New(cfg, service.Deps{}); err == nil || !strings.HasPrefix(err.Error(), "CONCLAVE_BRIDGE_MAX_RUNNING: must be positive") {
		t.Fatalf("New = %v, want CONCLAVE_BRIDGE_MAX_RUNNING: must be positive", err)
	}
}
