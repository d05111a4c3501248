package service_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// inspector runs the pinned @modelcontextprotocol/inspector-cli (the MCP
// Inspector's command-line client, on the TypeScript SDK) with args.
func inspector(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if testing.Short() {
		t.Skip("the real MCP client runs with Node.js from node_modules; skipped with -short")
	}
	node, script, err := testenv.NodeScript("@modelcontextprotocol", "inspector-cli", "build", "index.js")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{script}, args...)...)
	// The CLI finds its own package.json relative to the working directory.
	cmd.Dir = filepath.Dir(script)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// inspectorChecks lists the tools, calls one, and calls one with parameters
// that fail validation, through target (a command or a URL).
func inspectorChecks(t *testing.T, target ...string) {
	t.Helper()
	out, err := inspector(t, append(target, "--method", "tools/list")...)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, out)
	}
	var list struct {
		Tools []struct {
			Name        string
			InputSchema map[string]any
		}
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &list); err != nil {
		t.Fatalf("tools/list output: %v\n%s", err, out)
	}
	found := 0
	for _, tool := range list.Tools {
		if tool.InputSchema["type"] != "object" {
			t.Errorf("tool %s: inputSchema %v", tool.Name, tool.InputSchema)
		}
		if tool.Name == "label_github_issue" || tool.Name == "health_check" {
			found++
		}
	}
	if found != 2 {
		t.Fatalf("tools/list lacks label_github_issue or health_check:\n%s", out)
	}

	out, err = inspector(t, append(target, "--method", "tools/call", "--tool-name", "label_github_issue",
		"--tool-arg", "repo_name=facebook/react", "issue_number=42")...)
	if err != nil {
		t.Fatalf("tools/call: %v\n%s", err, out)
	}
	var res struct {
		IsError           bool `json:"isError"`
		StructuredContent struct {
			Status string
			Data   struct{ Labels []string }
		} `json:"structuredContent"`
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &res); err != nil || res.IsError || res.StructuredContent.Status != "success" || len(res.StructuredContent.Data.Labels) == 0 {
		t.Fatalf("tools/call: %v\n%s", err, out)
	}

	out, _ = inspector(t, append(target, "--method", "tools/call", "--tool-name", "label_github_issue",
		"--tool-arg", "repo_name=not/a/repo", "issue_number=42")...)
	if !strings.Contains(out, "Validation error: Invalid repo_name format") || !strings.Contains(out, `"isError": true`) {
		t.Fatalf("tools/call with an invalid repo_name:\n%s", out)
	}
}

// jsonPart drops the lines the CLI prints before its JSON (a deprecation
// banner).
func jsonPart(out string) string {
	if i := strings.Index(out, "{"); i >= 0 {
		return out[i:]
	}
	return out
}

func TestInspectorStdio(t *testing.T) {
	t.Parallel()
	inspectorChecks(t, bridgeBin, "mcp", "--bridge-config", workspace(t))
}

func TestInspectorStreamableHTTP(t *testing.T) {
	t.Parallel()
	b := startHTTP(t, nil)
	inspectorChecks(t, b.url, "--transport", "http", "--header", "Authorization: Bearer "+testToken)
}

// ConformanceScenarios are the @modelcontextprotocol/conformance server
// scenarios that apply to the bridge (the others need the suite's own test
// tools, prompts or resources); docs/bridge.md lists them.
var conformanceScenarios = []string{
	"server-initialize", "ping", "tools-list", "logging-set-level",
	"dns-rebinding-protection", "server-sse-multiple-streams",
}

func TestConformance(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("the conformance suite runs with Node.js from node_modules; skipped with -short")
	}
	// The suite sends no credentials: serve it as conclave dev does, on
	// loopback without tokens.
	b := startHTTP(t, func(c *serviceConfig) { c.Tokens, c.AllowUnauthenticated = nil, true })
	node, script, err := testenv.NodeScript("@modelcontextprotocol", "conformance", "dist", "index.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, scenario := range conformanceScenarios {
		t.Run(scenario, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, script, "server", "--url", b.url, "--scenario", scenario, "-o", t.TempDir())
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), " 0 failed") {
				t.Fatalf("conformance %s: %v\n%s", scenario, err, out)
			}
		})
	}
}
