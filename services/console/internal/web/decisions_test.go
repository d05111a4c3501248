package web

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/services/console/internal/backend"
)

// TestDecisionCopiesMerge: a decision made from the console and the bus's
// announcement of it are one entry with the console's comment and the
// bus's agent, whichever arrives first. The Librarian announces the
// decision while it answers the console, so the bus's copy often wins the
// race; it was once overwritten, losing the agent.
func TestDecisionCopiesMerge(t *testing.T) {
	t.Parallel()
	event, err := json.Marshal(map[string]any{
		"type": "librarian.request.approved", "event_id": "ev-1", "time": time.Now().UTC(),
		"subject_ids": map[string]string{"request_id": "req-1", "agent_id": "claude-3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	own := decision{RequestID: "req-1", Outcome: "approved", Source: "console", Comment: "Looks right.", At: time.Now().UTC()}
	for _, busFirst := range []bool{true, false} {
		h := &Handler{decisions: newRecent[decision](50)}
		if busFirst {
			h.recordDecision(backend.Message{Topic: "system:librarian.request.approved", Payload: event})
			h.recordOwnDecision(own)
		} else {
			h.recordOwnDecision(own)
			h.recordDecision(backend.Message{Topic: "system:librarian.request.approved", Payload: event})
		}
		got := h.decisions.list()
		if len(got) != 1 {
			t.Fatalf("bus first %t: %d entries, want 1: %+v", busFirst, len(got), got)
		}
		if d := got[0]; d.Source != "console" || d.Comment != "Looks right." || d.AgentID != "claude-3" || d.EventID != "ev-1" {
			t.Errorf("bus first %t: %+v, want the console's comment with the bus's agent and event", busFirst, d)
		}
	}
}
