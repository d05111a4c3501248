package service_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// A request declares depends_on edges: an approved change writes them into
// the knowledge graph, an unknown dependency is refused, and a change whose
// dependencies would close a cycle is rejected with the cycle.
func TestDependsOnEdges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	// create approves and completes a design at path with the given edges.
	create := func(path string, dependsOn []string) string {
		t.Helper()
		req := librarianApproval()
		req["target_path"], req["depends_on"] = path, dependsOn
		resp := e.do(t, "POST", "/agent/request", claudeToken, req).response(t)
		if resp.Status != "approved" {
			t.Fatalf("create %s: %v", path, resp)
		}
		report := map[string]any{"agent_id": "claude-3", "request_type": "REPORT", "request_id": resp.RequestId, "completed": true, "changes_made": []string{path}}
		e.do(t, "POST", "/agent/request", claudeToken, report).response(t)
		return resp.GetAssignedId()
	}
	storage := create("docs/design/storage.md", []string{"arch-001"})
	node, err := e.lib.Graph.Get(context.Background(), storage)
	if err != nil || !slices.Equal(node.DependsOn, []string{"arch-001"}) {
		t.Fatalf("graph node %+v %v; want depends_on [arch-001]", node, err)
	}
	cache := create("docs/design/cache.md", []string{storage})

	unknown := librarianApproval()
	unknown["target_path"], unknown["depends_on"] = "docs/design/other.md", []string{"design-nowhere"}
	if resp := e.do(t, "POST", "/agent/request", claudeToken, unknown).response(t); resp.Status != "rejected" ||
		!slices.ContainsFunc(resp.Violations, func(v *librarianv1.ViolationDetail) bool { return v.GetRule() == "invalid_dependency" }) {
		t.Fatalf("an unknown dependency: %v", resp)
	}

	// storage → cache would close storage → cache → storage.
	cycle := librarianApproval()
	delete(cycle, "target_path")
	cycle["action"], cycle["target_id"], cycle["references"], cycle["depends_on"] = "modify", storage, []string{}, []string{cache}
	resp := e.do(t, "POST", "/agent/request", claudeToken, cycle).response(t)
	if resp.Status != "rejected" || !strings.Contains(resp.Feedback, storage+" → "+cache+" → "+storage) {
		t.Fatalf("a cycle through depends_on: %v", resp)
	}

	tooMany := librarianApproval()
	deps := make([]string, 21)
	for i := range deps {
		deps[i] = "arch-001"
	}
	tooMany["depends_on"] = deps
	if r := e.do(t, "POST", "/agent/request", claudeToken, tooMany); r.status != 400 || !strings.Contains(string(r.body), "too_many_dependencies") {
		t.Fatalf("21 dependencies: %d %s", r.status, r.body)
	}
}
