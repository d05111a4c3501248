package service_test

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/services/runner/service"
)

// Each bad setting is refused naming its variable.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	base := map[string]string{"CONCLAVE_RUNNER_CLIENT_TOKENS": "t", "CONCLAVE_RUNNER_WORKSPACE_ROOTS": "/tmp"}
	for _, tt := range []struct {
		key, value, want string
	}{
		{"CONCLAVE_RUNNER_CLIENT_TOKENS", "", "CONCLAVE_RUNNER_CLIENT_TOKENS"},
		{"CONCLAVE_RUNNER_WORKSPACE_ROOTS", "", "CONCLAVE_RUNNER_WORKSPACE_ROOTS"},
		{"CONCLAVE_RUNNER_WORKSPACE_ROOTS", "relative/dir", "CONCLAVE_RUNNER_WORKSPACE_ROOTS"},
		{"CONCLAVE_RUNNER_WORKERS", "0", "CONCLAVE_RUNNER_WORKERS"},
		{"CONCLAVE_RUNNER_LAUNCH_RETRY", "100ms", "CONCLAVE_RUNNER_LAUNCH_RETRY"},
		{"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT", "0s", "CONCLAVE_RUNNER_PROTOCOL_TIMEOUT"},
		{"CONCLAVE_RUNNER_MAX_LINE_BYTES", "10", "CONCLAVE_RUNNER_MAX_LINE_BYTES"},
		{"CONCLAVE_RUNNER_AGENT_TYPES", "/does/not/exist.yaml", "CONCLAVE_RUNNER_AGENT_TYPES"},
	} {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			env[tt.key] = tt.value
			var cfg struct{ Runner service.Config }
			err := config.Load(context.Background(), &cfg, "runner", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %s", err, tt.want)
			}
		})
	}
	var cfg struct{ Runner service.Config }
	if err := config.Load(context.Background(), &cfg, "runner", nil, func(k string) (string, bool) { v, ok := base[k]; return v, ok }, io.Discard); err != nil {
		t.Fatalf("the base configuration: %v", err)
	}
}
