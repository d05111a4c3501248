// Package ratelimit counts each agent's requests against two limits at
// once, the API's (60 a minute) and the agent's own from the registry
// (e.g. 100 an hour), with atomic counters in the store, so that every
// Lambda instance sees the same counts. Each limit is a fixed window: one
// counter item per agent, limit and window, expiring after it.
package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/pkg/store"
)

// Table holds the counters.
var Table = store.Table{Name: "librarian-limits"}

// APIRate is the protocol's limit on /agent/request: 60 a minute per agent.
var APIRate = policy.Rate{Count: 60, Window: time.Minute}

// Limiter implements governance.Limiter over a store.
type Limiter struct {
	st  store.Store
	api policy.Rate
	now func() time.Time
}

// New counts in st; Table must exist. api is the API-wide limit per agent.
func New(st store.Store, api policy.Rate, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{st: st, api: api, now: now}
}

// TakeRead counts one read (status, capabilities, reviews, metrics) by
// subject, an agent or a reviewer, against rate: reads are cheaper than
// requests and have their own, larger budget.
func (l *Limiter) TakeRead(ctx context.Context, subject string, rate policy.Rate) (governance.Allowance, error) {
	now := l.now()
	start := now.Truncate(rate.Window)
	reset := start.Add(rate.Window)
	k := store.Key{PK: "rate#" + subject + "#read", SK: strconv.FormatInt(start.Unix(), 10)}
	n, err := l.st.Add(ctx, Table.Name, k, 1, reset.Add(time.Minute))
	if err != nil {
		return governance.Allowance{}, fmt.Errorf("ratelimit: count reads of %s: %w", subject, err)
	}
	return governance.Allowance{Name: "read", Limit: rate.Count, Remaining: max(0, rate.Count-int(n)), Reset: reset, Allowed: n <= int64(rate.Count)}, nil
}

// Take counts one request of agent against both limits, in one write.
func (l *Limiter) Take(ctx context.Context, agent policy.Agent) ([]governance.Allowance, error) {
	now := l.now()
	limits := []struct {
		name string
		rate policy.Rate
	}{{"api", l.api}, {"agent", agent.RateLimit}}
	counters := make([]store.Counter, len(limits))
	resets := make([]time.Time, len(limits))
	for i, lim := range limits {
		start := now.Truncate(lim.rate.Window)
		resets[i] = start.Add(lim.rate.Window)
		// The counter outlives its window a little, so clock skew between
		// instances never restarts a window early.
		counters[i] = store.Counter{Key: store.Key{PK: "rate#" + agent.ID + "#" + lim.name, SK: strconv.FormatInt(start.Unix(), 10)},
			Delta: 1, ExpiresAt: resets[i].Add(time.Minute)}
	}
	ns, err := l.st.AddMany(ctx, Table.Name, counters)
	if err != nil {
		return nil, fmt.Errorf("ratelimit: count %s: %w", agent.ID, err)
	}
	out := make([]governance.Allowance, 0, len(limits))
	for i, lim := range limits {
		out = append(out, governance.Allowance{
			Name: lim.name, Limit: lim.rate.Count, Remaining: max(0, lim.rate.Count-int(ns[i])), Reset: resets[i],
			Allowed: ns[i] <= int64(lim.rate.Count),
		})
	}
	return out, nil
}
