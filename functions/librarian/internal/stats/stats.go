// Package stats keeps the protocol's metrics (average validation
// time, approval and escalation rates) as atomic counters in the store, so
// that GET /metrics answers for every Lambda instance, not just the one it
// reaches. The counters share the rate limits' table, in their own
// partition.
package stats

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/internal/ratelimit"
	"github.com/conclave-ai/conclave/pkg/store"
)

const partition = "stats"

// Statuses counted, the protocol's decision statuses.
var Statuses = []string{"approved", "rejected", "escalated", "clarification_needed"}

// Stats counts decisions.
type Stats struct{ st store.Store }

// New counts in st; ratelimit.Table must exist.
func New(st store.Store) *Stats { return &Stats{st: st} }

func key(name string) store.Key { return store.Key{PK: partition, SK: name} }

// Record counts one decision and its validation time.
func (s *Stats) Record(ctx context.Context, status string, validation time.Duration) error {
	if _, err := s.st.Write(ctx, s.Ops(status, validation)...); err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	return nil
}

// Ops are the writes that count one decision and its validation time, for
// a caller to make with the write of the decision itself (requests.Create).
func (s *Stats) Ops(status string, validation time.Duration) []store.Op {
	return []store.Op{
		store.AddOp(ratelimit.Table.Name, key("decisions#"+status), 1, time.Time{}),
		store.AddOp(ratelimit.Table.Name, key("validation_us"), validation.Microseconds(), time.Time{}),
	}
}

// Snapshot returns avg_validation_ms, approval_rate and escalation_rate
// (percent of decisions), and the counts they come from.
func (s *Stats) Snapshot(ctx context.Context) (map[string]any, error) {
	keys := []store.Key{key("validation_us")}
	for _, st := range Statuses {
		keys = append(keys, key("decisions#"+st))
	}
	items, err := s.st.BatchGet(ctx, ratelimit.Table.Name, keys)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	counts := map[string]int64{}
	for _, it := range items {
		counts[it.SK] = it.Counter
	}
	var total int64
	decisions := map[string]int64{}
	for _, st := range Statuses {
		decisions[st] = counts["decisions#"+st]
		total += decisions[st]
	}
	rate := func(n int64) float64 {
		if total == 0 {
			return 0
		}
		return math.Round(float64(n)*10000/float64(total)) / 100
	}
	avg := 0.0
	if total > 0 {
		avg = math.Round(float64(counts["validation_us"])/float64(total)) / 1000
	}
	return map[string]any{
		"avg_validation_ms": avg,
		"approval_rate":     rate(decisions["approved"]),
		"escalation_rate":   rate(decisions["escalated"]),
		"decisions":         decisions,
		"total":             total,
	}, nil
}
