package service_test

import (
	"context"
	"os"
	"path/filepath"
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

func TestDiagnose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	py, err := systemPython()
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"ok.py": 0o644, "plain": 0o644, "notpython": 0o644} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("print('{}')\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	body := `agents:
  good: {path: ok.py, python: ` + py + `}
  no_script: {path: gone.py, python: ` + py + `}
  no_interpreter: {path: ok.py, python: python3.99-nonexistent}
  venv_missing: {path: ok.py, python: venv/bin/python}
  not_executable: {path: plain, executable: true}
  interpreter_not_executable: {path: ok.py, python: ./notpython}
  wants_token: {path: ok.py, python: ` + py + `, env: [BRIDGE_TEST_UNSET_TOKEN]}
`
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	findings := service.Diagnose(service.Config{ConfigFile: cfgPath, Env: func(string) (string, bool) { return "", false }})
	want := map[string]string{
		"agent good: ":                                   "",
		"agent no_script: script":                        "correct agents.no_script.path",
		"agent no_interpreter: interpreter python3.99":   "install python3.99-nonexistent, or set agents.no_interpreter.python",
		"agent venv_missing: interpreter":                "create the environment",
		"agent not_executable: script":                   "chmod +x",
		"agent interpreter_not_executable: interpreter":  "chmod +x",
		"agent wants_token: BRIDGE_TEST_UNSET_TOKEN is ": "export BRIDGE_TEST_UNSET_TOKEN",
	}
	for prefix, fix := range want {
		found := false
		for _, f := range findings {
			if strings.HasPrefix(f.What, prefix) {
				found = true
				if fix == "" && !f.OK || fix != "" && (f.OK || !strings.Contains(f.Fix, fix)) {
					t.Errorf("finding %+v, want fix containing %q", f, fix)
				}
			}
		}
		if !found {
			t.Errorf("no finding for %q in %+v", prefix, findings)
		}
	}
	h, err := service.CheckHealth(service.Config{ConfigFile: cfgPath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.Healthy || !h.Agents["good"].Healthy || h.Agents["no_script"].Healthy || len(h.Agents["no_script"].Problems) != 1 {
		t.Fatalf("health = %+v", h)
	}

	bad := service.Diagnose(service.Config{ConfigFile: filepath.Join(dir, "missing.yaml")})
	if len(bad) != 1 || bad[0].OK || !strings.Contains(bad[0].Fix, "CONCLAVE_BRIDGE_CONFIG") {
		t.Fatalf("missing config: %+v", bad)
	}
}
