package service_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/bus/service"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		wantKey string
	}{
		{"tokens required outside development", map[string]string{}, "CONCLAVE_BUS_GRANTS"},
		{"grants not JSON", map[string]string{"CONCLAVE_BUS_GRANTS": "token=x"}, "CONCLAVE_BUS_GRANTS"},
		{"short token", map[string]string{"CONCLAVE_BUS_GRANTS": `[{"token":"short","publish":["*"],"subscribe":[]}]`}, "CONCLAVE_BUS_GRANTS"},
		{"bad pattern", map[string]string{"CONCLAVE_BUS_GRANTS": `[{"token":"long-enough-token-123","publish":[""],"subscribe":[]}]`}, "CONCLAVE_BUS_GRANTS"},
		{"unknown policy", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_POLICY": "first"}, "CONCLAVE_BUS_POLICY"},
		{"retry delay over the queue's", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_RETRY_MAX_DELAY": "1h"}, "CONCLAVE_BUS_RETRY_MAX_DELAY"},
		{"half a certificate", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_TLS_CERT": "c.pem"}, "CONCLAVE_BUS_TLS_KEY"},
		{"zero attempts", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_RETRY_ATTEMPTS": "0"}, "CONCLAVE_BUS_RETRY_ATTEMPTS"},
		{"reply rule without its launch pattern", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_AGENT_REPLY_TOPICS": "outbound:{topic_id}"}, "CONCLAVE_BUS_AGENT_REPLY_TOPICS"},
		{"reply topics", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_AGENT_REPLY_TOPICS": "tg:*=outbound:{topic_id},tg:*=audit:{topic}"}, ""},
		{"development", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true"}, ""},
		{"production", map[string]string{"CONCLAVE_BUS_GRANTS": `[{"token":"long-enough-token-123","publish":["*"],"subscribe":["*"]}]`}, ""},
		{"open bus on the network", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_ADDR": "0.0.0.0:7892"}, "CONCLAVE_BUS_ADDR"},
		{"open bus on every interface by default", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_ADDR": ":7892"}, "CONCLAVE_BUS_ADDR"},
		{"15-character peer token", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_PEER_TOKEN": "fifteen-chars-x"}, "CONCLAVE_BUS_PEER_TOKEN"},
		{"15-character runner token", map[string]string{"CONCLAVE_BUS_ALLOW_UNAUTHENTICATED": "true", "CONCLAVE_BUS_RUNNER_TOKEN": "fifteen-chars-x"}, "CONCLAVE_BUS_RUNNER_TOKEN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var cfg struct{ Bus service.Config }
			err := config.Load(context.Background(), &cfg, "bus", nil, func(k string) (string, bool) {
				v, ok := tt.env[k]
				if !ok && k == "CONCLAVE_BUS_ADDR" {
					return "127.0.0.1:7892", true
				}
				return v, ok
			}, io.Discard)
			switch {
			case tt.wantKey == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.wantKey != "" && (err == nil || !strings.Contains(err.Error(), tt.wantKey)):
				t.Errorf("error %v, want one naming %s", err, tt.wantKey)
			}
		})
	}
}
