package service_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/runner/service"
)

// Each bad setting is refused naming its variable.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	base := map[string]string{"CONCLAVE_RUNNER_CLIENT_TOKENS": "runner-token-0123456789", "CONCLAVE_RUNNER_WORKSPACE_ROOTS": "/tmp"}
	kube := map[string]string{"CONCLAVE_RUNNER_EXECUTOR": "kubernetes", "CONCLAVE_RUNNER_HOST_KEY": strings.Repeat("k", 32),
		"CONCLAVE_RUNNER_KUBE_HOST_IMAGE": "conclave/agent-host:1"}
	for _, tt := range []struct {
		key, value, want string
		// also are settings besides base.
		also map[string]string
	}{
		{"CONCLAVE_RUNNER_CLIENT_TOKENS", "", "CONCLAVE_RUNNER_CLIENT_TOKENS", nil},
		{"CONCLAVE_RUNNER_CLIENT_TOKENS", "fifteen-chars-x", "CONCLAVE_RUNNER_CLIENT_TOKENS", nil},
		{"CONCLAVE_RUNNER_WORKSPACE_ROOTS", "", "CONCLAVE_RUNNER_WORKSPACE_ROOTS", nil},
		{"CONCLAVE_RUNNER_WORKSPACE_ROOTS", "relative/dir", "CONCLAVE_RUNNER_WORKSPACE_ROOTS", nil},
		{"CONCLAVE_RUNNER_WORKERS", "0", "CONCLAVE_RUNNER_WORKERS", nil},
		{"CONCLAVE_RUNNER_LAUNCH_RETRY", "100ms", "CONCLAVE_RUNNER_LAUNCH_RETRY", nil},
		{"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT", "0s", "CONCLAVE_RUNNER_PROTOCOL_TIMEOUT", nil},
		{"CONCLAVE_RUNNER_FORWARD_TIMEOUT", "0s", "CONCLAVE_RUNNER_FORWARD_TIMEOUT", nil},
		{"CONCLAVE_RUNNER_MAX_LINE_BYTES", "10", "CONCLAVE_RUNNER_MAX_LINE_BYTES", nil},
		{"CONCLAVE_RUNNER_AGENT_TYPES", "/does/not/exist.yaml", "CONCLAVE_RUNNER_AGENT_TYPES", nil},
		{"CONCLAVE_RUNNER_EXECUTOR", "docker", "CONCLAVE_RUNNER_EXECUTOR", nil},
		{"CONCLAVE_RUNNER_HOST_KEY", "", "CONCLAVE_RUNNER_HOST_KEY", kube},
		{"CONCLAVE_RUNNER_HOST_KEY", "short", "at least 32 bytes", kube},
		{"CONCLAVE_RUNNER_KUBE_HOST_IMAGE", "", "CONCLAVE_RUNNER_KUBE_HOST_IMAGE", kube},
		{"CONCLAVE_RUNNER_HOST_ADDR", "no-port", "CONCLAVE_RUNNER_HOST_ADDR", kube},
		{"CONCLAVE_RUNNER_HOST_START_TIMEOUT", "0s", "CONCLAVE_RUNNER_HOST_START_TIMEOUT", kube},
		{"CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY", "Sometimes", "CONCLAVE_RUNNER_KUBE_IMAGE_PULL_POLICY", kube},
		{"CONCLAVE_RUNNER_KUBE_NAMESPACE", "Not_A_Label", "CONCLAVE_RUNNER_KUBE_NAMESPACE", kube},
	} {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			for k, v := range tt.also {
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
	for name, env := range map[string]map[string]string{"local": base, "kubernetes": merge(base, kube)} {
		var cfg struct{ Runner service.Config }
		if err := config.Load(context.Background(), &cfg, "runner", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard); err != nil {
			t.Fatalf("the base %s configuration: %v", name, err)
		}
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestRunEndsWhenItCannotListen: a runner whose HTTP address is taken
// returns the bind error from Run, rather than waiting for its context.
func TestRunEndsWhenItCannotListen(t *testing.T) {
	if testing.Short() {
		t.Skip("binds listeners")
	}
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	root := filepath.Join(dir, "workspaces")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, root, map[string]string{"CONCLAVE_RUNNER_HTTP_ADDR": taken.Addr().String()})
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	for _, d := range service.Queues(cfg) {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "runner-test"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := service.New(cfg, service.Deps{Store: st, Queue: q, Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	// The context never ends: Run must return by itself.
	if err := r.Run(ctx); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Run = %v, want the bind error", err)
	}
}

// TestStartupLogListsAgentTypes: the runner says at startup which agent
// types it loaded, and which of them are disabled; an entry of the file
// without enabled is enabled, and a launch of a disabled one says why.
func TestStartupLogListsAgentTypes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(dir, "workspaces")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	types := filepath.Join(dir, "types.yaml")
	if err := os.WriteFile(types, []byte("agent_types:\n  - id: plain\n    command: [/bin/true]\n  - id: off\n    command: [/bin/true]\n    enabled: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, root, map[string]string{"CONCLAVE_RUNNER_AGENT_TYPES": types})
	st, err := store.OpenBolt(filepath.Join(dir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q, err := queue.OpenEmbedded(filepath.Join(dir, "queues.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "runner-test"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if _, err := service.New(cfg, service.Deps{Store: st, Queue: q, Logger: slog.New(slog.NewTextHandler(&out, nil)), Telemetry: tel}); err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.Contains(l, "agent types loaded") {
			line = l
		}
	}
	for _, want := range []string{"count=3", "augment-agent (kandev, image kandev/augment-agent:latest)", "off (detect, /bin/true, disabled)", "plain (detect, /bin/true)"} {
		if !strings.Contains(line, want) {
			t.Errorf("the startup log's agent types line %q does not say %q; the log:\n%s", line, want, out.String())
		}
	}
}

// TestNewChecksConfig: New refuses a Config that Validate refuses, before
// it uses any of its Deps, with the error naming the setting.
func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, t.TempDir(), nil)
	cfg.ClientBurst = 0
	if _, err := service.New(cfg, service.Deps{}); err == nil || !strings.HasPrefix(err.Error(), "CONCLAVE_RUNNER_CLIENT_BURST: must be positive") {
		t.Fatalf("New = %v, want CONCLAVE_RUNNER_CLIENT_BURST: must be positive", err)
	}
}
