package lambdafn

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
)

// scheduled is what tells EventBridge's scheduled event apart from API
// Gateway's proxy events.
type scheduled struct {
	Source     string `json:"source"`
	DetailType string `json:"detail-type"`
}

// SweepResult answers a scheduled invocation.
type SweepResult struct {
	// Rejected counts the escalations the sweep rejected as overdue.
	Rejected int `json:"rejected"`
}

// withSchedule serves EventBridge's scheduled events (infra/template.yaml's
// LibrarianSweepSchedule) with sweep, and every other event with api. Only
// a principal allowed to invoke the function can send such an event: API
// Gateway hands the function its own proxy events, whatever the request.
func withSchedule(api func(context.Context, json.RawMessage) (any, error), sweep func(context.Context) (int, error), logger *slog.Logger) func(context.Context, json.RawMessage) (any, error) {
	return func(ctx context.Context, event json.RawMessage) (any, error) {
		var s scheduled
		if json.Unmarshal(event, &s) != nil || s.Source != "aws.events" || s.DetailType != "Scheduled Event" {
			return api(ctx, event)
		}
		n, err := sweep(ctx)
		if err != nil {
			return nil, fmt.Errorf("escalation sweep (%d rejected before the failure): %w", n, err)
		}
		if n > 0 {
			logger.InfoContext(ctx, "escalation sweep rejected overdue requests", "rejected", n)
		}
		return SweepResult{Rejected: n}, nil
	}
}
