package service_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

// TestClientLimitSettings loads the per-client limit, idempotency and
// liveness settings as cmd/gateway does, from the environment.
func TestClientLimitSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		check   func(service.Config) bool
		wantErr string // the error's prefix: the setting it is about
	}{
		{name: "defaults", check: func(c service.Config) bool {
			return c.ClientRate == 50 && c.ClientBurst == 100 && c.ClientStreams == 64 && c.IdempotencyTTL == 24*time.Hour
		}},
		{name: "fractional rate", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_RATE": "0.5", "CONCLAVE_GATEWAY_IDEMPOTENCY_TTL": "1h"},
			check: func(c service.Config) bool { return c.ClientRate == 0.5 && c.IdempotencyTTL == time.Hour }},
		{name: "zero rate", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_RATE": "0"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_RATE: "},
		{name: "negative rate", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_RATE": "-1"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_RATE: "},
		{name: "NaN rate", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_RATE": "NaN"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_RATE: "},
		{name: "infinite rate", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_RATE": "+Inf"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_RATE: "},
		{name: "zero burst", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_BURST": "0"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_BURST: "},
		{name: "negative streams", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_STREAMS": "-1"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_STREAMS: "},
		{name: "zero TTL", env: map[string]string{"CONCLAVE_GATEWAY_IDEMPOTENCY_TTL": "0s"}, wantErr: "CONCLAVE_GATEWAY_IDEMPOTENCY_TTL: "},
		// Liveness: heartbeats are optional, the transport finds dead peers.
		{name: "liveness defaults", check: func(c service.Config) bool {
			return c.AgentTimeout == 0 && c.KeepaliveTime == 30*time.Second && c.KeepaliveTimeout == 20*time.Second
		}},
		{name: "an agent timeout", env: map[string]string{"CONCLAVE_GATEWAY_AGENT_TIMEOUT": "2m", "CONCLAVE_GATEWAY_KEEPALIVE_TIME": "10s"},
			check: func(c service.Config) bool {
				return c.AgentTimeout == 2*time.Minute && c.KeepaliveTime == 10*time.Second
			}},
		{name: "negative agent timeout", env: map[string]string{"CONCLAVE_GATEWAY_AGENT_TIMEOUT": "-1s"}, wantErr: "CONCLAVE_GATEWAY_AGENT_TIMEOUT: "},
		{name: "zero keepalive", env: map[string]string{"CONCLAVE_GATEWAY_KEEPALIVE_TIME": "0s"}, wantErr: "CONCLAVE_GATEWAY_KEEPALIVE_TIME: "},
		{name: "zero keepalive timeout", env: map[string]string{"CONCLAVE_GATEWAY_KEEPALIVE_TIMEOUT": "0s"}, wantErr: "CONCLAVE_GATEWAY_KEEPALIVE_TIMEOUT: "},
		// Agents without tokens on every interface.
		{name: "open agent listener on the network", env: map[string]string{"CONCLAVE_GATEWAY_GRPC_ADDR": ":50051"}, wantErr: "CONCLAVE_GATEWAY_GRPC_ADDR: "},
		{name: "open client API on the network", env: map[string]string{"CONCLAVE_GATEWAY_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_GATEWAY_HTTP_ADDR": "0.0.0.0:8080"},
			wantErr: "CONCLAVE_GATEWAY_HTTP_ADDR: "},
		// The standalone gateway once accepted CONCLAVE_GATEWAY_CLIENT_TOKENS=a.
		{name: "one-character client token", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_TOKENS": "a"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_TOKENS: "},
		{name: "15-character client token", env: map[string]string{"CONCLAVE_GATEWAY_CLIENT_TOKENS": token + ",fifteen-chars-x"}, wantErr: "CONCLAVE_GATEWAY_CLIENT_TOKENS: "},
		{name: "15-character agent token", env: map[string]string{"CONCLAVE_GATEWAY_AGENT_TOKENS": "agent-1=fifteen-chars-x"}, wantErr: "CONCLAVE_GATEWAY_AGENT_TOKENS: "},
		// The URL the A2A agent cards name.
		{name: "a public URL", env: map[string]string{"CONCLAVE_GATEWAY_PUBLIC_URL": "https://agents.example.com"},
			check: func(c service.Config) bool { return c.PublicURL == "https://agents.example.com" }},
		{name: "a public URL with a path", env: map[string]string{"CONCLAVE_GATEWAY_PUBLIC_URL": "https://agents.example.com/a2a"}, wantErr: "CONCLAVE_GATEWAY_PUBLIC_URL: "},
		{name: "a public URL without a scheme", env: map[string]string{"CONCLAVE_GATEWAY_PUBLIC_URL": "agents.example.com"}, wantErr: "CONCLAVE_GATEWAY_PUBLIC_URL: "},
		{name: "a public URL with credentials", env: map[string]string{"CONCLAVE_GATEWAY_PUBLIC_URL": "https://u:p@agents.example.com"}, wantErr: "CONCLAVE_GATEWAY_PUBLIC_URL: "},
		{name: "16-character agent token", env: map[string]string{"CONCLAVE_GATEWAY_AGENT_TOKENS": "agent-1=sixteen-chars-xy"},
			check: func(c service.Config) bool { return len(c.AgentTokens) == 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{
				"CONCLAVE_GATEWAY_CLIENT_TOKENS":               token,
				"CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS": "true",
				// Agents without tokens: loopback only.
				"CONCLAVE_GATEWAY_GRPC_ADDR": "127.0.0.1:50051",
				"CONCLAVE_GATEWAY_HTTP_ADDR": "127.0.0.1:8080",
			}
			for k, v := range tt.env {
				env[k] = v
			}
			var c service.Config
			err := config.Load(context.Background(), &c, "gateway", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load: %v, want an error starting %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !tt.check(c) {
				t.Fatalf("Load: %+v, %v", c, err)
			}
		})
	}
}

// TestNewChecksConfig: New refuses a Config that Validate refuses, before
// it uses any of its Deps, with the error naming the setting.
func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig("gw-bad")
	cfg.Lease = 0
	if _, err := service.New(cfg, service.Deps{}); err == nil || !strings.HasPrefix(err.Error(), "CONCLAVE_GATEWAY_LEASE: must be positive") {
		t.Fatalf("New = %v, want CONCLAVE_GATEWAY_LEASE: must be positive", err)
	}
}
