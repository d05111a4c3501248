package web

import (
	"slices"
	"sync"
	"time"
)

// keyed is an item of a recent list, deduplicated on its key.
type keyed interface{ key() string }

// recent keeps the last few items seen, newest first: the runner
// instances a session launched or opened (for the traces of its launches
// and prompts) and the Librarian's decisions made from the console or
// announced on the bus (for their traces, and for a Librarian that does
// not list its decisions).
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

// knownInstance is a runner instance a session launched or was shown,
// kept for the trace of its launch and prompts.
type knownInstance struct {
	// Owner is the id of the session that launched or opened it.
	Owner     string
	ID        string
	TaskID    string
	AgentType string
	TraceID   string
	Seen      time.Time
}

func (k knownInstance) key() string { return instanceKey(k.Owner, k.ID) }

func instanceKey(owner, id string) string { return owner + "\x00" + id }

// decision is a Librarian decision: one it lists (GET
// /reviews?status=decided), one made from the console, or one announced on
// the bus (system:librarian.request.approved / .rejected).
type decision struct {
	EventID   string
	RequestID string
	AgentID   string
	Outcome   string // approved, rejected (clarification_needed from the Librarian's list)
	Source    string // "librarian" (its list), "console" or "bus"
	// DecidedBy and Reviewer are the Librarian's: librarian, reviewer or
	// timeout, and the reviewer's name.
	DecidedBy string
	Reviewer  string
	Comment   string
	TraceID   string
	At        time.Time
}

func (d decision) key() string { return d.RequestID + "/" + d.Outcome }
