// Package runner_test measures the ACP runner: how long from a launch
// request to the first session/update an API client sees, against the floor
// of starting the same agent process and speaking the same protocol to it
// directly. The notification-parsing benchmark lives beside the parser, in
// services/runner/internal/acp (BenchmarkNotifications); see README.md.
package runner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
	"github.com/conclave-ai/conclave/services/runner/service"
)

func buildAgent(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "acp-agent")
	if err := testenv.GoBuild(context.Background(), bin, "./examples/acp-agent"); err != nil {
		b.Fatal(err)
	}
	return bin
}

// reportPercentiles reports p50 and p99 of samples in milliseconds.
func reportPercentiles(b *testing.B, samples []time.Duration) {
	slices.Sort(samples)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(samples[len(samples)/2]), "p50-ms")
	b.ReportMetric(ms(samples[len(samples)*99/100]), "p99-ms")
}

// BenchmarkFirstUpdate: one op is one launch, timed until its first
// session/update. "runner": POST /api/v1/agents/launch, then GET
// .../logs?follow=true until the first "acp" line, with the embedded store
// and queue (conclave dev's). "bare-process": exec the agent, write
// initialize, session/new and session/prompt, read until the first
// session/update.
func BenchmarkFirstUpdate(b *testing.B) {
	agent := buildAgent(b)
	b.Run("bare-process", func(b *testing.B) {
		samples := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for range b.N {
			start := time.Now()
			cmd := exec.Command(agent, "-dialect", "acp")
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			io.WriteString(stdin, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`+"\n"+
				`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}`+"\n"+
				`{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"go"}]}}`+"\n")
			sc := bufio.NewScanner(stdout)
			for sc.Scan() && !strings.Contains(sc.Text(), `"session/update"`) {
			}
			samples = append(samples, time.Since(start))
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		reportPercentiles(b, samples)
	})
	b.Run("runner", func(b *testing.B) {
		base, root := startRunner(b, agent)
		samples := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			body := fmt.Sprintf(`{"task_id":"bench-%d","agent_type":"example","workspace_path":%q,"env":{"TASK_DESCRIPTION":"go"}}`, i, root)
			resp, err := http.Post(base+"/api/v1/agents/launch", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			var in struct{ ID string }
			_ = json.NewDecoder(resp.Body).Decode(&in)
			resp.Body.Close()
			if in.ID == "" {
				b.Fatalf("launch: HTTP %d", resp.StatusCode)
			}
			follow, err := http.Get(base + "/api/v1/agents/" + in.ID + "/logs?follow=true")
			if err != nil {
				b.Fatal(err)
			}
			sc := bufio.NewScanner(follow.Body)
			for sc.Scan() && !strings.Contains(sc.Text(), `"stream":"acp"`) {
			}
			samples = append(samples, time.Since(start))
			follow.Body.Close()
			req, _ := http.NewRequest(http.MethodDelete, base+"/api/v1/agents/"+in.ID, nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
		b.StopTimer()
		reportPercentiles(b, samples)
	})
}

func startRunner(b *testing.B, agent string) (base, root string) {
	dir := b.TempDir()
	types := filepath.Join(dir, "types.yaml")
	if err := os.WriteFile(types, []byte(fmt.Sprintf("agent_types:\n  - id: example\n    command: [%q, -dialect, acp, -mode, slow-tool]\n    permission: allow\n    enabled: true\n", agent)), 0o644); err != nil {
		b.Fatal(err)
	}
	return startBenchRunner(b, map[string]string{"CONCLAVE_RUNNER_GRPC_ADDR": "127.0.0.1:0",
		"CONCLAVE_RUNNER_WORKSPACE_ROOTS": dir, "CONCLAVE_RUNNER_AGENT_TYPES": types}, nil), dir
}

// startBenchRunner runs a runner with the settings env adds to those both
// benchmarks share (an open API on loopback, no client rate limit), on an
// embedded store and queue, until the benchmark ends; it returns the
// URL of its REST API.
func startBenchRunner(b *testing.B, env map[string]string, kube *rest.Config) string {
	vars := map[string]string{
		"CONCLAVE_RUNNER_HTTP_ADDR": "127.0.0.1:0", "CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "true",
		"CONCLAVE_RUNNER_SERVER_ID":   "bench",
		"CONCLAVE_RUNNER_CLIENT_RATE": "1000000", "CONCLAVE_RUNNER_CLIENT_BURST": "1000000",
	}
	maps.Copy(vars, env)
	cfg := runnertest.Config(b, vars)
	st, q := runnertest.State(b, cfg)
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "runner-bench"})
	if err != nil {
		b.Fatal(err)
	}
	_, api, _ := runnertest.Start(b, cfg, service.Deps{Store: st, Queue: q, Logger: slog.New(slog.DiscardHandler), Telemetry: tel, Kube: kube})
	if api.Base == "" {
		b.Fatal("the runner has no HTTP endpoint")
	}
	return api.Base
}
