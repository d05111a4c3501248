package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bridge/bridgetest"
	bridge "github.com/conclave-ai/conclave/services/bridge/service"
)

const bridgeToken = "bridge-client-0123456789abcdef"

// markerAgent is a Python tool agent (the ADK bridge's hybrid protocol) that
// leaves a file named after its call in its workspace when it runs, so a
// test can tell whether it ran.
const markerAgent = `import json, os, sys
params = json.load(sys.stdin)
open(os.path.join(os.getcwd(), "ran-" + params["call"]), "w").close()
print(json.dumps({"status": "success", "data": {"call": params["call"]}}))
`

// startGovernedBridge serves a bridge whose tools are governed, on e's
// Librarian and bus, and returns an MCP client session to it and the
// agents' workspace.
func startGovernedBridge(t *testing.T, e *governedEnv, librarianURL string) (*mcp.ClientSession, string, *telemetry.Provider) {
	t.Helper()
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "marker.py"), []byte(markerAgent), 0o644); err != nil {
		t.Fatal(err)
	}
	tool := func(name, extra string) string {
		return fmt.Sprintf("  %s:\n    path: marker.py\n    timeout: 60\n    governed: true\n%s    parameters:\n      type: object\n      properties: {call: {type: string}}\n      required: [call]\n", name, extra)
	}
	yaml := "workspace: " + ws + "\nagents:\n" + tool("mark", "") + tool("mark_risky", "    risk: \"high: writes into the workspace\"\n") +
		tool("mark_risky_quick", "    risk: \"high: writes into the workspace\"\n    approval_timeout: 2s\n")
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := loadConfig[bridge.Config](t, map[string]string{
		"CONCLAVE_BRIDGE_CONFIG": file, "CONCLAVE_BRIDGE_HTTP_ADDR": "127.0.0.1:0", "CONCLAVE_BRIDGE_TOKENS": bridgeToken,
		"CONCLAVE_BRIDGE_LIBRARIAN_URL": librarianURL, "CONCLAVE_BRIDGE_LIBRARIAN_TOKEN": bridgeLibToken,
		"CONCLAVE_BRIDGE_BUS_URL": e.busURL, "CONCLAVE_BRIDGE_BUS_TOKEN": bridgeBusToken,
	})
	cfg.Env = func(k string) (string, bool) { return os.LookupEnv(k) }
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "governed-bridge"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := bridge.New(cfg, bridge.Deps{Logger: testLogger(t, "bridge"), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = b.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	<-b.Ready()
	cs := bridgetest.Connect(t, readyURL(b, "http://", "HTTP")+bridge.MCPPath, bridgeToken, "governed-test", nil)
	return cs, ws, tel
}

// escalatedOf waits for an escalated request of agent to wait for review
// on the Librarian and returns its id.
func (e *governedEnv) escalatedOf(t *testing.T, agent string) string {
	t.Helper()
	var id string
	testenv.Eventually(t, 2*time.Minute, "an escalated request of "+agent, func() bool {
		var list struct {
			Requests []struct {
				RequestID string `json:"request_id"`
				Response  struct {
					Status string `json:"status"`
				} `json:"response"`
			} `json:"requests"`
		}
		call(t, "GET", e.librarianURL+"/reviews?status=escalated", reviewerLibToken, nil, &list)
		if len(list.Requests) == 0 {
			return false
		}
		id = list.Requests[0].RequestID
		return true
	})
	return id
}

// TestGovernedBridgeTools: a governed tool's call first asks the
// Librarian; the Python agent runs only when the call is approved (at once,
// or by a person after an escalation); a call not approved (rejected by a
// person, timed out, or with the Librarian down) is an MCP tool error
// naming the decision, and the agent never runs.
func TestGovernedBridgeTools(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the Librarian, the bus, the bridge and python3")
	}
	eachBackend(t, func(t *testing.T, b backend) {
		governedBridgeTools(t, b.aws)
	})
}

// governedBridgeTools is TestGovernedBridgeTools on one backend (aws:
// dynalite and fauxqs).
func governedBridgeTools(t *testing.T, aws bool) {
	e := startGoverned(t, governedOptions{aws: aws, runnerProcess: true})
	cs, ws, tel := startGovernedBridge(t, e, e.librarianURL)
	callTool := func(name, id string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"call": id}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	ran := func(id string) bool {
		_, err := os.Stat(filepath.Join(ws, "ran-"+id))
		return err == nil
	}
	text := func(res *mcp.CallToolResult) string {
		b, _ := json.Marshal(res.Content)
		return string(b)
	}

	if res := callTool("mark", "approved"); res.IsError || !ran("approved") {
		t.Errorf("an approved call: error %v, ran %v: %s", res.IsError, ran("approved"), text(res))
	}

	for _, tt := range []struct {
		id, decision string
		allowed      bool
	}{{"escalated-approved", "approve", true}, {"escalated-rejected", "reject", false}} {
		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "mark_risky", Arguments: map[string]any{"call": tt.id}})
			if err != nil {
				t.Errorf("mark_risky: %v", err)
			}
			done <- res
		}()
		id := e.escalatedOf(t, bridgeAgent)
		if ran(tt.id) {
			t.Fatalf("%s ran before anyone decided", tt.id)
		}
		e.decide(t, id, tt.decision, "Decided by the test.")
		res := <-done
		if res == nil {
			continue
		}
		switch {
		case tt.allowed && (res.IsError || !ran(tt.id)):
			t.Errorf("%s: error %v, ran %v: %s", tt.id, res.IsError, ran(tt.id), text(res))
		case !tt.allowed && (!res.IsError || ran(tt.id) || !strings.Contains(text(res), "Not approved: the Librarian's decision on mark_risky is rejected") ||
			!strings.Contains(text(res), "Rejected by reviewer alice")):
			t.Errorf("%s: error %v, ran %v: %s", tt.id, res.IsError, ran(tt.id), text(res))
		}
	}

	if res := callTool("mark_risky_quick", "timeout"); !res.IsError || ran("timeout") || !strings.Contains(text(res), "is timeout: no one decided") {
		t.Errorf("a call no one decided in time: error %v, ran %v: %s", res.IsError, ran("timeout"), text(res))
	}

	rec := httptestRecorder(tel)
	approvals := grepLines(rec, "conclave_bridge_approvals_total{")
	for _, want := range []string{`outcome="approved"`, `outcome="rejected"`, `outcome="timeout"`} {
		if !strings.Contains(approvals, want) {
			t.Errorf("conclave_bridge_approvals_total lacks %s:\n%s", want, approvals)
		}
	}
	if !strings.Contains(rec, "conclave_bridge_approval_wait_seconds_count{") ||
		!strings.Contains(grepLines(rec, "conclave_bridge_tool_calls_total{"), `outcome="not_approved"`) {
		t.Errorf("the bridge's metrics:\n%s", grepLines(rec, "approval"))
	}

	// The Librarian down: failing closed.
	down, ws2, tel2 := startGovernedBridge(t, e, "http://127.0.0.1:1")
	res, err := down.CallTool(context.Background(), &mcp.CallToolParams{Name: "mark", Arguments: map[string]any{"call": "down"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, statErr := os.Stat(filepath.Join(ws2, "ran-down")); !res.IsError || statErr == nil || !strings.Contains(text(res), "could not be asked about mark (unavailable)") {
		t.Errorf("with the Librarian down: error %v, ran %v: %s", res.IsError, statErr == nil, text(res))
	}
	if m := httptestRecorder(tel2); !strings.Contains(m, `conclave_bridge_approval_fail_closed_total{`) {
		t.Errorf("no fail-closed refusal counted:\n%s", grepLines(m, "approval"))
	}
}

func httptestRecorder(tel *telemetry.Provider) string {
	e := &governedEnv{tel: tel}
	return e.metrics(nil)
}
