package web

import (
	"slices"
	"sync"
	"time"
)

// keyed is an item of a recent list, deduplicated on its key.
type keyed interface{ key() string }

// recent keeps the last few items seen, newest first: the runner
// instances the console knows of (the runner's API has no list) and the
// Librarian's recent decisions (its API has none either).
type recent[T keyed] struct {
	mu    sync.Mutex
	max   int
	items []T
}

func newRecent[T keyed](max int) *recent[T] { return &recent[T]{max: max} }

// add puts item first, replacing an item with the same key.
func (r *recent[T]) add(item T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = slices.DeleteFunc(r.items, func(x T) bool { return x.key() == item.key() })
	r.items = slices.Insert(r.items, 0, item)
	if len(r.items) > r.max {
		r.items = r.items[:r.max]
	}
}

// get returns the item with key k.
func (r *recent[T]) get(k string) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.items {
		if x.key() == k {
			return x, true
		}
	}
	var zero T
	return zero, false
}

func (r *recent[T]) list() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.items)
}

// knownInstance is a runner instance the console launched or was shown.
type knownInstance struct {
	ID        string
	TaskID    string
	AgentType string
	TraceID   string
	Seen      time.Time
}

func (k knownInstance) key() string { return k.ID }

// decision is a Librarian decision: one made from the console, or one
// announced on the bus (system:librarian.request.approved / .rejected).
type decision struct {
	EventID   string
	RequestID string
	AgentID   string
	Outcome   string // approved, rejected
	Source    string // "console" or "bus"
	Comment   string
	TraceID   string
	At        time.Time
}

func (d decision) key() string { return d.RequestID + "/" + d.Outcome }
