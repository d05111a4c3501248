// Package requests keeps the Librarian's requests and their decisions in
// the store. A request is one item changed only by conditional writes on
// its version, so two Lambda instances deciding the same request cannot
// both win; requests waiting for a human are also listed in an index
// partition per state, which readers check against the request itself.
package requests

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/pkg/store"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// Table holds requests (partition "req#<id>"), the state index
// (partition "state#<STATE>", sorted by creation time) and the decided
// list (partition "decided", sorted by decision time).
var Table = store.Table{Name: "librarian-requests"}

// Errors callers test with errors.Is.
var (
	ErrNotFound = errors.New("no such request")
	// ErrConflict is returned when the request kept changing underneath an
	// update.
	ErrConflict = errors.New("the request changed concurrently")
)

// Review is a human's decision on an escalated request.
type Review struct {
	Reviewer string    `json:"reviewer"`
	Decision string    `json:"decision"`
	Comment  string    `json:"comment"`
	At       time.Time `json:"at"`
}

// Report is what the agent reported after an approval.
type Report struct {
	Completed   bool      `json:"completed"`
	ChangesMade []string  `json:"changes_made"`
	Content     string    `json:"content,omitempty"`
	At          time.Time `json:"at"`
}

// Record is a stored request.
type Record struct {
	ID       string                         `json:"id"`
	AgentID  string                         `json:"agent_id"`
	State    governance.State               `json:"state"`
	Request  *librarianv1.AgentRequest      `json:"-"`
	Response *librarianv1.LibrarianResponse `json:"-"`
	Results  []governance.RuleResult        `json:"results,omitempty"`
	Review   *Review                        `json:"review,omitempty"`
	Reports  []Report                       `json:"reports,omitempty"`
	// Subject and Location are the graph node the request is about and
	// where an approved create goes.
	Subject  string `json:"subject,omitempty"`
	Location string `json:"location,omitempty"`
	// Outbox holds the events of the last changes (encoded envelopes) until
	// they are published; it is written with the change itself, so an
	// event is never lost between the two.
	Outbox []json.RawMessage `json:"outbox,omitempty"`
	// ReviewBy is when an escalated request expires without a human
	// decision (timeouts.escalation after it was escalated).
	ReviewBy time.Time `json:"review_by,omitzero"`
	// DecidedAt is when the request was approved, rejected or sent back
	// for clarification: by the validation pipeline on creation, or by a
	// reviewer (or the escalation timeout) later. It names the request's
	// entry in the decided list.
	DecidedAt time.Time `json:"decided_at,omitzero"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Traceparent and Tracestate are the trace context the request was
	// submitted in: every event about it is sent in that trace, so that a
	// reviewer's decision reaches the waiting agent in the agent's trace.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
	// Version is the store's, for conditional updates.
	Version int64 `json:"-"`
}

// stored is a Record as it is written: the protobuf messages as protojson.
type stored struct {
	Record
	RequestJSON  json.RawMessage `json:"request"`
	ResponseJSON json.RawMessage `json:"response,omitempty"`
}

var marshal = protojson.MarshalOptions{UseProtoNames: true}

func encode(r Record) ([]byte, error) {
	s := stored{Record: r}
	var err error
	if s.RequestJSON, err = marshal.Marshal(r.Request); err != nil {
		return nil, err
	}
	if r.Response != nil {
		if s.ResponseJSON, err = marshal.Marshal(r.Response); err != nil {
			return nil, err
		}
	}
	return json.Marshal(s)
}

func decode(it store.Item) (Record, error) {
	var s stored
	if err := json.Unmarshal(it.Data, &s); err != nil {
		return Record{}, fmt.Errorf("request %s is corrupt: %w", it.PK, err)
	}
	r := s.Record
	r.Request, r.Response = &librarianv1.AgentRequest{}, &librarianv1.LibrarianResponse{}
	if err := protojson.Unmarshal(s.RequestJSON, r.Request); err != nil {
		return Record{}, fmt.Errorf("request %s is corrupt: %w", it.PK, err)
	}
	if len(s.ResponseJSON) > 0 {
		if err := protojson.Unmarshal(s.ResponseJSON, r.Response); err != nil {
			return Record{}, fmt.Errorf("request %s is corrupt: %w", it.PK, err)
		}
	}
	r.Version = it.Version
	return r, nil
}

// Store keeps requests.
type Store struct {
	st  store.Store
	now func() time.Time
}

// New returns a Store over st; Table must exist. now is the clock of the
// records' times (nil: time.Now).
func New(st store.Store, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{st: st, now: now}
}

// NewID returns a fresh request id.
func NewID() string {
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return "req-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// RetryID returns the request id of a submission that carries an
// idempotency key (the Idempotency-Key header, or the request itself when
// it is stamped with the protocol's timestamp): the same agent sending the same
// key gets the same id, so a retry after a lost answer finds the request
// stored by the first attempt instead of creating a second one.
func RetryID(agentID string, key []byte) string {
	sum := sha256.Sum256(append(append([]byte(agentID), 0), key...))
	return "req-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:10]))
}

// ValidID reports whether id could be a request id, so that client input
// never reaches the store as an unbounded key.
func ValidID(id string) bool {
	if len(id) != 4+16 || !strings.HasPrefix(id, "req-") {
		return false
	}
	for _, c := range id[4:] {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

func key(id string) store.Key { return store.Key{PK: "req#" + id, SK: "req"} }

func indexKey(state governance.State, created time.Time, id string) store.Key {
	return store.Key{PK: "state#" + string(state), SK: created.UTC().Format(time.RFC3339Nano) + "#" + id}
}

// decidedPK is the partition of the decided list: an entry per decided
// request, its sort key the decision time in nanoseconds (fixed width, so
// that it sorts by time) and the request id.
const decidedPK = "decided"

func decidedKey(at time.Time, id string) store.Key {
	return store.Key{PK: decidedPK, SK: fmt.Sprintf("%020d#%s", at.UnixNano(), id)}
}

// Decided reports whether a request in state s has been decided: approved,
// rejected or sent back for clarification.
func Decided(s governance.State) bool {
	switch s {
	case governance.Approved, governance.Rejected, governance.ClarificationNeeded:
		return true
	}
	return false
}

// decide stamps r's decision time when it has just been decided (from is
// its state before, "" for a new request; a completed request was decided
// when it was approved), and returns the write of its entry in the decided
// list, to go with the write of the request. The entry goes first: on a
// store without transactions (dynalite) the ops are written in order, and
// an entry whose request was then not written (a concurrent update, a
// retried submission) is one that ListDecided does not find matching its
// request, and skips.
func decide(from governance.State, r *Record, now time.Time) []store.Op {
	if !Decided(r.State) || Decided(from) || !r.DecidedAt.IsZero() {
		return nil
	}
	r.DecidedAt = now
	return []store.Op{store.PutOp(Table.Name, store.Item{Key: decidedKey(now, r.ID), Attrs: map[string]string{"id": r.ID}}, store.IfNotExists())}
}

// undecide removes the decided entry that decide added for next when the
// write of next was surely refused (its condition failed) on a store that
// wrote the entry before it (no transactions), so that retries and
// duplicate creations leave no entries behind. After any other error the
// write may have landed, and the entry stays (the listing passes over an
// entry its request does not match).
func (s *Store) undecide(ctx context.Context, cur, next Record) {
	if next.DecidedAt.IsZero() || next.DecidedAt.Equal(cur.DecidedAt) {
		return
	}
	_ = s.st.Delete(context.WithoutCancel(ctx), Table.Name, decidedKey(next.DecidedAt, next.ID))
}

// indexed are the states listed by List.
var indexed = map[governance.State]bool{governance.Escalated: true}

// Create stores a new request, its decided-list and index entries, and
// extra (such as statistics counters), in one write: one commit on the
// embedded store, one transaction on DynamoDB. A request with the same id
// already stored is an error wrapping store.ErrConditionFailed, and then
// nothing of the write is kept.
func (s *Store) Create(ctx context.Context, r Record, extra ...store.Op) (Record, error) {
	now := s.now().UTC()
	r.CreatedAt, r.UpdatedAt = now, now
	ops := decide("", &r, now)
	data, err := encode(r)
	if err != nil {
		return r, fmt.Errorf("requests: encode %s: %w", r.ID, err)
	}
	at := len(ops)
	ops = append(ops, store.PutOp(Table.Name, store.Item{Key: key(r.ID), Data: data, Attrs: map[string]string{"agent": r.AgentID, "state": string(r.State)}}, store.IfNotExists()))
	ops = append(ops, index("", r)...)
	ops = append(ops, extra...)
	out, err := s.st.Write(ctx, ops...)
	if err != nil {
		if errors.Is(err, store.ErrConditionFailed) {
			s.undecide(ctx, Record{}, r)
		}
		return r, fmt.Errorf("requests: create %s: %w", r.ID, err)
	}
	r.Version = out[at].Version
	return r, nil
}

// index are the writes that add r to its state's index and remove it from
// the one it left, written with the request itself. On a store without
// transactions they come after it, and a crash between leaves a stale
// entry that List skips, or a missing one that the next update of the
// request repairs.
func index(from governance.State, r Record) []store.Op {
	var ops []store.Op
	if from != r.State && indexed[from] {
		ops = append(ops, store.DeleteOp(Table.Name, indexKey(from, r.CreatedAt, r.ID)))
	}
	if indexed[r.State] {
		var conds []store.Condition
		if from == "" {
			// A new entry (its key holds the creation time): on DynamoDB
			// the condition spares the read an unconditional put makes.
			conds = append(conds, store.IfNotExists())
		}
		ops = append(ops, store.PutOp(Table.Name, store.Item{Key: indexKey(r.State, r.CreatedAt, r.ID), Attrs: map[string]string{"id": r.ID}}, conds...))
	}
	return ops
}

// Get returns the request with id.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	if !ValidID(id) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	it, err := s.st.Get(ctx, Table.Name, key(id))
	if errors.Is(err, store.ErrNotFound) {
		return Record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Record{}, fmt.Errorf("requests: read %s: %w", id, err)
	}
	return decode(it)
}

// Owner implements governance.Requests.
func (s *Store) Owner(ctx context.Context, id string) (string, bool, error) {
	r, err := s.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return r.AgentID, true, nil
}

// Update applies change to the request, retrying on a concurrent write.
// change sees the current record; an error from it (such as an illegal
// transition) is returned as it is, and nothing is written.
func (s *Store) Update(ctx context.Context, id string, change func(*Record) error) (Record, error) {
	return s.update(ctx, id, nil, change)
}

// UpdateFrom is Update starting from cur, the record as the caller last
// read or wrote it: when nothing changed it since, that saves the read.
func (s *Store) UpdateFrom(ctx context.Context, cur Record, change func(*Record) error) (Record, error) {
	return s.update(ctx, cur.ID, &cur, change)
}

func (s *Store) update(ctx context.Context, id string, known *Record, change func(*Record) error) (Record, error) {
	for range 5 {
		var cur Record
		if known != nil {
			cur, known = *known, nil
		} else {
			var err error
			if cur, err = s.Get(ctx, id); err != nil {
				return cur, err
			}
		}
		next := cur
		if err := change(&next); err != nil {
			return cur, err
		}
		next.UpdatedAt = s.now().UTC()
		ops := decide(cur.State, &next, next.UpdatedAt)
		data, err := encode(next)
		if err != nil {
			return cur, fmt.Errorf("requests: encode %s: %w", id, err)
		}
		at := len(ops)
		ops = append(ops, store.PutOp(Table.Name, store.Item{Key: key(id), Data: data, Attrs: map[string]string{"agent": next.AgentID, "state": string(next.State)}},
			store.IfVersion(cur.Version)))
		ops = append(ops, index(cur.State, next)...)
		out, err := s.st.Write(ctx, ops...)
		if errors.Is(err, store.ErrConditionFailed) {
			s.undecide(ctx, cur, next)
			continue
		}
		if err != nil {
			return cur, fmt.Errorf("requests: write %s: %w", id, err)
		}
		next.Version = out[at].Version
		return next, nil
	}
	return Record{}, fmt.Errorf("%w: %s", ErrConflict, id)
}

// List returns up to limit requests in state (only ESCALATED is indexed),
// oldest first.
func (s *Store) List(ctx context.Context, state governance.State, limit int) ([]Record, error) {
	recs, _, err := s.ListPage(ctx, state, limit, "")
	return recs, err
}

// ListPage is List continued from cursor (empty: the oldest); next is the
// cursor of the following page, empty after the last.
func (s *Store) ListPage(ctx context.Context, state governance.State, limit int, cursor string) (recs []Record, next string, err error) {
	if !indexed[state] {
		return nil, "", fmt.Errorf("requests: %s requests are not listed", state)
	}
	page, err := s.st.Query(ctx, Table.Name, store.Query{PK: "state#" + string(state), Limit: limit, Cursor: cursor})
	if err != nil {
		return nil, "", fmt.Errorf("requests: list %s: %w", state, err)
	}
	keys := make([]store.Key, 0, len(page.Items))
	for _, it := range page.Items {
		keys = append(keys, key(it.Attrs["id"]))
	}
	items, err := s.st.BatchGet(ctx, Table.Name, keys)
	if err != nil {
		return nil, "", fmt.Errorf("requests: list %s: %w", state, err)
	}
	out := make([]Record, 0, len(items))
	for _, it := range items {
		r, err := decode(it)
		if err != nil {
			return nil, "", err
		}
		if r.State == state { // an entry left behind by an interrupted update
			out = append(out, r)
		}
	}
	return out, page.Cursor, nil
}

// DecidedPage is a page of decided requests, the latest decision first.
type DecidedPage struct {
	Records []Record
	// Next continues the listing (ListDecided's after); empty at its end.
	Next string
}

// ValidDecidedPosition reports whether s can be ListDecided's after.
func ValidDecidedPosition(s string) bool {
	ns, id, ok := strings.Cut(s, "#")
	if !ok || len(ns) != 20 || !ValidID(id) {
		return false
	}
	for _, c := range ns {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ListDecided returns up to limit decided requests (1 to 1000), the latest
// decision first, continuing after a previous page's Next (empty: from the
// latest). An entry whose request does not carry its decision time (its
// write did not happen) is skipped, so a page may hold fewer than limit.
func (s *Store) ListDecided(ctx context.Context, limit int, after string) (DecidedPage, error) {
	if limit < 1 || limit > 1000 {
		return DecidedPage{}, fmt.Errorf("requests: decided list limit %d is outside 1..1000", limit)
	}
	if after != "" && !ValidDecidedPosition(after) {
		return DecidedPage{}, fmt.Errorf("requests: malformed decided list position: %w", store.ErrInvalid)
	}
	// One more than asked, for the entry at after itself (To is inclusive)
	// and to know whether another page follows.
	page, err := s.st.Query(ctx, Table.Name, store.Query{PK: decidedPK, Reverse: true, To: after, Limit: limit + 2})
	if err != nil {
		return DecidedPage{}, fmt.Errorf("requests: list decided: %w", err)
	}
	entries := page.Items
	if len(entries) > 0 && entries[0].SK == after {
		entries = entries[1:]
	}
	more := page.Cursor != "" || len(entries) > limit
	entries = entries[:min(len(entries), limit)]
	keys := make([]store.Key, 0, len(entries))
	for _, it := range entries {
		keys = append(keys, key(it.Attrs["id"]))
	}
	items, err := s.st.BatchGet(ctx, Table.Name, keys)
	if err != nil {
		return DecidedPage{}, fmt.Errorf("requests: list decided: %w", err)
	}
	byKey := make(map[string]store.Item, len(items))
	for _, it := range items {
		byKey[it.PK] = it
	}
	var out DecidedPage
	for _, e := range entries {
		it, ok := byKey[key(e.Attrs["id"]).PK]
		if !ok {
			continue
		}
		r, err := decode(it)
		if err != nil {
			return DecidedPage{}, err
		}
		if !r.DecidedAt.IsZero() && decidedKey(r.DecidedAt, r.ID) == e.Key {
			out.Records = append(out.Records, r)
		}
	}
	if more && len(entries) > 0 {
		out.Next = entries[len(entries)-1].SK
	}
	return out, nil
}
