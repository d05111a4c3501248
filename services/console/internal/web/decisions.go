package web

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/services/console/internal/backend"
)

// DecisionsPattern is where the bus publishes the Librarian's decisions
// (its events, system:librarian.request.approved and .rejected).
const DecisionsPattern = "system:librarian.request.*"

// WatchDecisions keeps the recent decisions list from the bus until ctx
// ends, reconnecting with backoff (1s doubling to 30s) when the bus is
// away. token is the console's own bus token (empty on an open bus).
func (h *Handler) WatchDecisions(ctx context.Context, token string) {
	backoff := time.Second
	for ctx.Err() == nil {
		start := time.Now()
		err := h.o.Bus.Watch(ctx, token, DecisionsPattern, func() {
			h.o.Logger.DebugContext(ctx, "watching the Librarian's decisions on the bus", "pattern", DecisionsPattern)
		}, h.recordDecision)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		h.o.Logger.DebugContext(ctx, "the bus watch for decisions ended; retrying", "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// recordDecision keeps an approval or rejection announced on the bus. The
// payload is the bus's event shape: {type, event_id, time, subject_ids,
// data}.
func (h *Handler) recordDecision(m backend.Message) {
	var ev struct {
		Type       string            `json:"type"`
		EventID    string            `json:"event_id"`
		Time       time.Time         `json:"time"`
		SubjectIDs map[string]string `json:"subject_ids"`
	}
	if err := json.Unmarshal(m.Payload, &ev); err != nil {
		return
	}
	outcome, ok := strings.CutPrefix(ev.Type, "librarian.request.")
	if !ok || (outcome != "approved" && outcome != "rejected") {
		return
	}
	at := ev.Time
	if at.IsZero() {
		at = m.Received
	}
	d := decision{EventID: ev.EventID, RequestID: ev.SubjectIDs["request_id"], AgentID: ev.SubjectIDs["agent_id"],
		Outcome: outcome, Source: "bus", TraceID: m.TraceID, At: at.UTC()}
	if d.RequestID == "" {
		return
	}
	h.decisionsMu.Lock()
	defer h.decisionsMu.Unlock()
	// A decision made from this console is already listed, with its
	// comment; the bus's copy adds the agent.
	if mine, ok := h.decisions.get(d.key()); ok && mine.Source == "console" {
		mine.AgentID, mine.EventID = d.AgentID, d.EventID
		h.decisions.add(mine)
		return
	}
	h.decisions.add(d)
}

// recordOwnDecision lists a decision made from this console. The
// Librarian announces it on the bus while it answers the console, so the
// bus's copy may be listed first: its agent is kept.
func (h *Handler) recordOwnDecision(d decision) {
	h.decisionsMu.Lock()
	defer h.decisionsMu.Unlock()
	if theirs, ok := h.decisions.get(d.key()); ok && theirs.Source == "bus" {
		d.AgentID, d.EventID = theirs.AgentID, theirs.EventID
	}
	h.decisions.add(d)
}
