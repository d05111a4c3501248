// Package bridge benchmarks a tool call through the bridge against running
// the same trivial Python agent directly through a shell pipe, side by side
// in one run: the bridge's goal is at most 1.1× the direct run.
package bridge

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/services/bridge/bridgetest"
	"github.com/conclave-ai/conclave/services/bridge/service"
)

const params = `{"repo_name":"facebook/react","issue_number":42,"dry_run":true}`

// python is the real interpreter behind python3, so that no version
// manager's shim is measured.
func python(b *testing.B) string {
	b.Helper()
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		b.Fatalf("python3: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func agentScript(b *testing.B) string {
	b.Helper()
	p, err := filepath.Abs("../../examples/tool-agents/agents/stdin_agent.py")
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func BenchmarkToolCall(b *testing.B) {
	py, script := python(b), agentScript(b)
	dir := filepath.Dir(script)

	// The baseline: what an operator types to test an agent by hand, with
	// the same working directory and environment the bridge gives it.
	b.Run("shell_pipe", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cmd := exec.Command("/bin/sh", "-c", "echo '"+params+"' | "+py+" "+script)
			cmd.Dir, cmd.Env = dir, []string{"PYTHONPATH=" + dir}
			out, err := cmd.Output()
			if err != nil || !strings.Contains(string(out), `"success"`) {
				b.Fatalf("%v %s", err, out)
			}
		}
	})

	// The execution core alone: validation, argv, process group, parsing.
	b.Run("hybrid_run", func(b *testing.B) {
		b.ReportAllocs()
		a := &hybrid.Agent{Name: "label", Interpreter: py, Script: script, Dir: dir, Env: []string{"PYTHONPATH=" + dir},
			Flags:   []hybrid.Flag{{Param: "issue_number", Flag: "--issue"}, {Param: "repo_name", Flag: "--repo"}, {Param: "dry_run", Flag: "--dry-run"}},
			Timeout: time.Minute, ValidateInputs: true}
		for b.Loop() {
			p, err := hybrid.DecodeParams([]byte(params))
			if err != nil {
				b.Fatal(err)
			}
			if r, err := hybrid.Run(context.Background(), a, p); err != nil || r.Status != hybrid.StatusSuccess {
				b.Fatalf("%v %v", r, err)
			}
		}
	})

	// The whole path: an MCP client's tools/call over streamable HTTP on
	// loopback, with authentication, schema and hybrid-protocol validation, logging and
	// metrics.
	b.Run("mcp_streamable_http", func(b *testing.B) {
		cs := startBridge(b, py, script)
		var args map[string]any
		_ = json.Unmarshal([]byte(params), &args)
		b.ReportAllocs()
		for b.Loop() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "label_github_issue", Arguments: args})
			if err != nil || res.IsError {
				b.Fatalf("%+v %v", res, err)
			}
		}
	})
}

// BenchmarkOverheadInterleaved alternates the three ways of calling the
// agent within each iteration, so that the load of a shared machine weighs
// on all of them alike, and reports each one's mean and the ratios to the
// shell pipe.
func BenchmarkOverheadInterleaved(b *testing.B) {
	py, script := python(b), agentScript(b)
	dir := filepath.Dir(script)
	cs := startBridge(b, py, script)
	var args map[string]any
	_ = json.Unmarshal([]byte(params), &args)
	a := &hybrid.Agent{Name: "label", Interpreter: py, Script: script, Dir: dir, Env: []string{"PYTHONPATH=" + dir},
		Flags:   []hybrid.Flag{{Param: "issue_number", Flag: "--issue"}, {Param: "repo_name", Flag: "--repo"}, {Param: "dry_run", Flag: "--dry-run"}},
		Timeout: time.Minute, ValidateInputs: true}
	var shell, core, full time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		cmd := exec.Command("/bin/sh", "-c", "echo '"+params+"' | "+py+" "+script)
		cmd.Dir, cmd.Env = dir, []string{"PYTHONPATH=" + dir}
		if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), `"success"`) {
			b.Fatalf("%v %s", err, out)
		}
		shell += time.Since(start)

		start = time.Now()
		p, err := hybrid.DecodeParams([]byte(params))
		if err != nil {
			b.Fatal(err)
		}
		if r, err := hybrid.Run(context.Background(), a, p); err != nil || r.Status != hybrid.StatusSuccess {
			b.Fatalf("%v %v", r, err)
		}
		core += time.Since(start)

		start = time.Now()
		if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "label_github_issue", Arguments: args}); err != nil || res.IsError {
			b.Fatalf("%+v %v", res, err)
		}
		full += time.Since(start)
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(n) / 1e6 }
	b.ReportMetric(ms(shell), "shell-ms/op")
	b.ReportMetric(ms(core), "hybrid-ms/op")
	b.ReportMetric(ms(full), "mcp-ms/op")
	b.ReportMetric(float64(core)/float64(shell), "hybrid/shell")
	b.ReportMetric(float64(full)/float64(shell), "mcp/shell")
}

func startBridge(b *testing.B, py, script string) *mcp.ClientSession {
	b.Helper()
	dir := b.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	body := "workspace: " + filepath.Dir(script) + "\nagents:\n  label_github_issue:\n    path: " + script + "\n    python: " + py +
		"\n    args: {issue_number: --issue, repo_name: --repo, dry_run: --dry-run}\n" +
		"    parameters: {type: object, properties: {repo_name: {type: string}, issue_number: {type: integer}, dry_run: {type: boolean}}}\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		b.Fatal(err)
	}
	br := bridgetest.Serve(b, service.Config{ConfigFile: cfg, HTTPAddr: "127.0.0.1:0", Tokens: []string{"bench-token-0123456789"},
		ShutdownTimeout: 5 * time.Second, ProgressInterval: time.Minute, MaxRequestBytes: 4 << 20, Rate: 1e6, Burst: 1e6,
		MaxRunning: 16, Env: os.LookupEnv}, "bridge-bench")
	return bridgetest.Connect(b, br.MCP(), "bench-token-0123456789", "bench", nil)
}
