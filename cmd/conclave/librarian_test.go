package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	librarian "github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// TestLibrarianCommands: the operator issues tokens and imports a seed
// graph on the store, then an agent and a reviewer use the client
// commands against a running Librarian.
func TestLibrarianCommands(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	seed := filepath.Join(dir, "seed")
	if err := os.MkdirAll(filepath.Join(seed, "architecture"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seed, "architecture", "auth.md"), []byte("---\nid: arch-001\n---\n# Authentication\n\nOAuth tokens everywhere.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"CONCLAVE_DATA_DIR": filepath.Join(dir, "data")}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	run := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := runLibrarian(ctx, args, lookup, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	if out, err := run("import", seed); err != nil || !strings.Contains(out, "imported 1 nodes") {
		t.Fatalf("import: %s %v", out, err)
	}
	tokenOf := func(out string) string {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return lines[len(lines)-1]
	}
	out, err := run("tokens", "create", "--agent", "claude-3")
	if err != nil {
		t.Fatal(err)
	}
	agentToken := tokenOf(out)
	out, err = run("tokens", "create", "--reviewer", "alice")
	if err != nil {
		t.Fatal(err)
	}
	reviewerToken := tokenOf(out)
	out, err = run("tokens", "create", "--agent", "copilot-2")
	if err != nil {
		t.Fatal(err)
	}
	revoked := tokenOf(out)
	if _, err := run("tokens", "revoke", revoked); err != nil {
		t.Fatal(err)
	}
	if _, err := run("tokens", "create"); err == nil {
		t.Fatal("a token for nobody")
	}

	// The Librarian, on the same store file.
	env["CONCLAVE_LIBRARIAN_URL"] = startLibrarian(t, filepath.Join(dir, "data"), false)

	req := filepath.Join(dir, "req.json")
	body, _ := json.Marshal(map[string]any{"agent_id": "claude-3", "request_type": "APPROVAL", "action": "create", "target_type": "architecture",
		"content": "# Sessions\n\n## Context\nx\n\n## Decision\ny\n\n## Consequences\nz\n", "rationale": "US-9", "references": []string{"arch-001"},
		"risk_assessment": "high"})
	if err := os.WriteFile(req, body, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run("request", req, "--token", agentToken)
	if err != nil || !strings.Contains(out, `"status": "escalated"`) {
		t.Fatalf("request: %s %v", out, err)
	}
	var resp struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatal(err)
	}
	if out, err := run("status", resp.RequestID, "--token", agentToken); err != nil || !strings.Contains(out, `"escalated"`) {
		t.Fatalf("status: %s %v", out, err)
	}
	if out, err := run("query", "oauth", "tokens", "--token", agentToken); err != nil || !strings.Contains(out, "arch-001") {
		t.Fatalf("query: %s %v", out, err)
	}
	if out, err := run("review", "list", "--token", reviewerToken); err != nil || !strings.Contains(out, resp.RequestID) {
		t.Fatalf("review list: %s %v", out, err)
	}
	if _, err := run("review", "approve", resp.RequestID, "-m", "ok", "--token", agentToken); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("an agent approved: %v", err)
	}
	if out, err := run("review", "approve", resp.RequestID, "-m", "Looks right.", "--token", reviewerToken); err != nil || !strings.Contains(out, `"approved"`) {
		t.Fatalf("approve: %s %v", out, err)
	}
	if _, err := run("review", "reject", resp.RequestID, "-m", "Too late.", "--token", reviewerToken); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("a decided request rejected: %v", err)
	}

	// A second escalation, rejected from the CLI.
	out, err = run("request", req, "--token", agentToken)
	if err != nil || !strings.Contains(out, `"status": "escalated"`) {
		t.Fatalf("second request: %s %v", out, err)
	}
	var second struct {
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal([]byte(out), &second); err != nil {
		t.Fatal(err)
	}
	if out, err := run("review", "reject", second.RequestID, "-m", "Needs a threat model.", "--token", reviewerToken); err != nil || !strings.Contains(out, `"rejected"`) {
		t.Fatalf("reject: %s %v", out, err)
	}
	if out, err := run("status", second.RequestID, "--token", agentToken); err != nil || !strings.Contains(out, `"rejected"`) || !strings.Contains(out, "Needs a threat model.") {
		t.Fatalf("status after the rejection: %s %v", out, err)
	}
	if _, err := run("status", resp.RequestID, "--token", revoked); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a revoked token: %v", err)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startLibrarian runs the Librarian on loopback over the embedded store in
// dataDir (state.db, as the operator commands open it) until the test
// ends, and returns its URL.
func startLibrarian(t *testing.T, dataDir string, allowUnauthenticated bool) string {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenBolt(filepath.Join(dataDir, "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := store.EnsureTables(t.Context(), st, librarian.Tables...); err != nil {
		t.Fatal(err)
	}
	q, err := queue.OpenEmbedded(filepath.Join(t.TempDir(), "queue.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	for _, d := range librarian.Queues(librarian.Config{}) {
		if err := q.Ensure(t.Context(), d); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := librarian.New(librarian.Config{HTTPAddr: "127.0.0.1:0", APIRate: "60/minute", ReadRate: "600/minute", ShutdownTimeout: time.Second, AllowUnauthenticated: allowUnauthenticated},
		librarian.Deps{Store: st, Queue: q, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	// Registered after the store's and queue's, so it runs before them.
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the Librarian's Run: %v", err)
		}
	})
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("the Librarian stopped before it was ready: %v", err)
	}
	return "http://" + svc.Endpoints()[0].Address
}

// TestLibrarianQueryAsAnAgent: without a token, as in conclave dev, the
// query names the agent it asks as; each command's help lists its own
// flags only.
func TestLibrarianQueryAsAnAgent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := startLibrarian(t, t.TempDir(), true)

	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantOut string // in stdout and stderr
		wantErr string // "" for success
	}{
		{"--agent", []string{"query", "--agent", "gemini-pro", "oauth"}, nil, `"query": "oauth"`, ""},
		{"the agent from the environment", []string{"query", "oauth"}, map[string]string{"CONCLAVE_LIBRARIAN_AGENT_ID": "gemini-pro"}, `"query": "oauth"`, ""},
		{"no agent and no token", []string{"query", "oauth"}, nil, "", "--agent ID"},
		{"an agent the Librarian does not know", []string{"query", "--agent", "nobody", "oauth"}, nil, "", "403"},
		{"query's help", []string{"query", "-h"}, nil, "-agent", ""},
		{"review's help", []string{"review", "-h"}, nil, "reviewer's comment", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"CONCLAVE_LIBRARIAN_URL": base}
			for k, v := range tt.env {
				env[k] = v
			}
			var out, errOut bytes.Buffer
			err := runLibrarian(ctx, tt.args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, &errOut)
			got := out.String() + errOut.String()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("%v: %v\n%s", tt.args, err, got)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("%v: error %v, want one saying %q\n%s", tt.args, err, tt.wantErr, got)
			case !strings.Contains(got, tt.wantOut):
				t.Fatalf("%v printed:\n%s\nwant %q in it", tt.args, got, tt.wantOut)
			}
			if tt.args[0] == "query" && tt.args[1] == "-h" && strings.Contains(got, "-m ") {
				t.Errorf("query's help lists review's -m:\n%s", got)
			}
		})
	}
}
