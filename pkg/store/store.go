// Package store is Conclave's item store: a DynamoDB-shaped port with two
// backends, DynamoDB itself (aws-sdk-go-v2) and an embedded one-file bbolt
// store for `conclave dev` and single-node use.
//
// The port is deliberately narrow: items under a partition and sort key,
// conditional writes, atomic counters, TTL, ordered queries within one
// partition, and writes of several items in one transaction (Write), which
// dynalite, the DynamoDB test server, applies one at a time instead. Services get their correctness from conditional
// writes and version numbers, so both backends must agree exactly on those;
// one contract test suite runs against both.
package store

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"
)

// MaxItemBytes is DynamoDB's item size limit; both backends enforce it before
// any request is sent, so a service fails the same way in dev and production.
const MaxItemBytes = 400 * 1024

// Errors callers test with errors.Is.
var (
	// ErrConditionFailed is returned when a write's condition does not hold.
	ErrConditionFailed = errors.New("store: condition failed")
	// ErrNotFound is returned by Get for a missing or expired item.
	ErrNotFound = errors.New("store: item not found")
	// ErrItemTooLarge is returned before sending an item over MaxItemBytes.
	ErrItemTooLarge = errors.New("store: item too large")
	// ErrTableNotFound is returned when a table was never created.
	ErrTableNotFound = errors.New("store: table not found")
	// ErrInvalid is returned for a malformed key, attribute, query or cursor.
	ErrInvalid = errors.New("store: invalid request")
)

// Store is the port every service keeps its state through.
type Store interface {
	// EnsureTable creates the table if it does not exist.
	EnsureTable(ctx context.Context, t Table) error
	// Get returns the item at key, or ErrNotFound.
	Get(ctx context.Context, table string, key Key) (Item, error)
	// Put writes item if every condition holds and returns it as stored,
	// with its new Version.
	Put(ctx context.Context, table string, item Item, conds ...Condition) (Item, error)
	// Delete removes the item at key if every condition holds. Deleting a
	// missing item without conditions succeeds.
	Delete(ctx context.Context, table string, key Key, conds ...Condition) error
	// Add adds delta to the item's counter and returns the new value. A
	// missing or expired item starts from zero, with expiresAt as its expiry
	// (zero: never); an existing item keeps its expiry.
	Add(ctx context.Context, table string, key Key, delta int64, expiresAt time.Time) (int64, error)
	// AddMany adds to several counters of one table, each as Add does, and
	// returns their new values in order. On the embedded backend they
	// share one commit; on DynamoDB they are sent at once, each its own
	// atomic update (not a transaction: a transaction returns no values).
	AddMany(ctx context.Context, table string, counters []Counter) ([]int64, error)
	// Write applies ops atomically: every op's conditions hold and all
	// are written, or none is and the error says which failed (a failed
	// condition wraps ErrConditionFailed). It returns, for each put, the
	// item as stored with its new Version, and a zero Item for the
	// others. The embedded backend writes them in one transaction (one
	// commit, shared with concurrent writers); DynamoDB in one
	// TransactWriteItems, or, on a server without transactions (dynalite),
	// one op at a time in order, stopping at the first failure, so that
	// callers order ops such that any prefix of them is a state they
	// tolerate.
	Write(ctx context.Context, ops ...Op) ([]Item, error)
	// Query returns items of one partition in sort-key order.
	Query(ctx context.Context, table string, q Query) (Page, error)
	// BatchGet returns the items found at keys, in the order of keys;
	// missing and expired items are left out, and a repeated key is
	// answered once.
	BatchGet(ctx context.Context, table string, keys []Key) ([]Item, error)
	// Close releases the backend.
	Close() error
}

// Table is one table's definition, written once in Go and used to create it
// locally, in tests and (mirrored in infra/) in AWS.
type Table struct {
	Name string
}

// Key addresses an item.
type Key struct {
	PK string // partition key
	SK string // sort key
}

// Item is a stored item.
type Item struct {
	Key
	// Data is the service's payload, opaque to the store.
	Data []byte
	// Attrs are small named strings that conditions can test.
	Attrs map[string]string
	// Version is set by the store: 1 on creation, one more on every write.
	Version int64
	// Counter is the value maintained by Add.
	Counter int64
	// ExpiresAt is when the item expires; zero means never. Expired items
	// are invisible at once, whenever the backend gets round to deleting them.
	ExpiresAt time.Time
}

// Condition is a precondition on a write.
type Condition struct {
	kind  conditionKind
	name  string
	value string
	ver   int64
}

type conditionKind int

const (
	condNotExists conditionKind = iota + 1
	condExists
	condVersion
	condAttrEquals
)

// IfNotExists holds when no live item is at the key.
func IfNotExists() Condition { return Condition{kind: condNotExists} }

// IfExists holds when a live item is at the key.
func IfExists() Condition { return Condition{kind: condExists} }

// IfVersion holds when the live item at the key has version v.
func IfVersion(v int64) Condition { return Condition{kind: condVersion, ver: v} }

// IfAttrEquals holds when the live item at the key has attribute name equal
// to value.
func IfAttrEquals(name, value string) Condition {
	return Condition{kind: condAttrEquals, name: name, value: value}
}

func (c Condition) String() string {
	switch c.kind {
	case condNotExists:
		return "if not exists"
	case condExists:
		return "if exists"
	case condVersion:
		return fmt.Sprintf("if version = %d", c.ver)
	case condAttrEquals:
		return fmt.Sprintf("if %s = %q", c.name, c.value)
	}
	return "unknown condition"
}

// holds evaluates c against the live item (nil when absent or expired). The
// DynamoDB backend evaluates the same rules as condition expressions.
func (c Condition) holds(cur *Item) bool {
	switch c.kind {
	case condNotExists:
		return cur == nil
	case condExists:
		return cur != nil
	case condVersion:
		return cur != nil && cur.Version == c.ver
	case condAttrEquals:
		return cur != nil && cur.Attrs[c.name] == c.value
	}
	return false
}

// Query selects items of one partition.
type Query struct {
	PK string
	// Prefix keeps sort keys beginning with it.
	Prefix string
	// From and To bound the sort key, both inclusive; either may be empty.
	// They cannot be combined with Prefix.
	From, To string
	// Limit is the most items to return; 0 means 100, and at most 1000.
	Limit int
	// Cursor continues a previous query: Page.Cursor.
	Cursor string
	// Reverse returns items in descending sort-key order.
	Reverse bool
}

// Page is one page of query results.
type Page struct {
	Items []Item
	// Cursor continues the query; empty when there is nothing more.
	Cursor string
}

const (
	defaultLimit = 100
	maxLimit     = 1000
	maxKeyBytes  = 1024 // DynamoDB's sort-key limit; the partition key's is 2048.
	// MaxBatchGet bounds BatchGet; the DynamoDB backend splits it into
	// requests of 100 keys.
	MaxBatchGet = 1000
)

// attrNamePattern leaves the length (at most 64) to validAttrName: a
// counted repetition ({0,63}) compiles to that many copies of its class,
// and compiling it at package initialization was a measurable part of the
// Librarian Lambda's cold start (bench/librarian).
var attrNamePattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]*$`)

func validAttrName(name string) bool { return len(name) <= 64 && attrNamePattern.MatchString(name) }

func validateKey(k Key) error {
	switch {
	case k.PK == "":
		return fmt.Errorf("%w: empty partition key", ErrInvalid)
	case k.SK == "":
		// DynamoDB rejects empty key strings; so does the embedded backend.
		return fmt.Errorf("%w: empty sort key", ErrInvalid)
	case len(k.PK) > 2048 || len(k.SK) > maxKeyBytes:
		return fmt.Errorf("%w: key longer than DynamoDB allows", ErrInvalid)
	case !utf8.ValidString(k.PK) || !utf8.ValidString(k.SK):
		// DynamoDB string keys are UTF-8, and the embedded backend's range
		// bounds rely on it.
		return fmt.Errorf("%w: key is not UTF-8", ErrInvalid)
	}
	return nil
}

func validateBatch(keys []Key) error {
	if len(keys) > MaxBatchGet {
		return fmt.Errorf("%w: %d keys, at most %d", ErrInvalid, len(keys), MaxBatchGet)
	}
	for _, k := range keys {
		if err := validateKey(k); err != nil {
			return err
		}
	}
	return nil
}

// EnsureTables creates every table a service defines.
func EnsureTables(ctx context.Context, s Store, tables ...Table) error {
	for _, t := range tables {
		if err := s.EnsureTable(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

func validateItem(it Item) error {
	if err := validateKey(it.Key); err != nil {
		return err
	}
	for name := range it.Attrs {
		if !validAttrName(name) {
			return fmt.Errorf("%w: attribute name %q must match ^[A-Za-z][A-Za-z0-9_]{0,63}$", ErrInvalid, name)
		}
	}
	if n := itemSize(it); n > MaxItemBytes {
		return fmt.Errorf("%w: %s/%s is %d bytes, the limit is %d", ErrItemTooLarge, it.PK, it.SK, n, MaxItemBytes)
	}
	return nil
}

// itemSize follows DynamoDB's accounting: attribute names plus values, with
// the fixed attributes each backend adds counted as their DynamoDB encoding.
func itemSize(it Item) int {
	n := len("pk") + len(it.PK) + len("sk") + len(it.SK) + len("ver") + 21 + len("n") + 21 + len("exp_ms") + 21 + len("ttl") + 21
	if len(it.Data) > 0 {
		n += len("d") + len(it.Data)
	}
	for k, v := range it.Attrs {
		n += len(attrPrefix) + len(k) + len(v)
	}
	return n
}

func validateConditions(conds []Condition) error {
	for _, c := range conds {
		if c.kind == 0 {
			return fmt.Errorf("%w: zero Condition", ErrInvalid)
		}
		if c.kind == condAttrEquals && !validAttrName(c.name) {
			return fmt.Errorf("%w: attribute name %q", ErrInvalid, c.name)
		}
	}
	return nil
}

func normalizeQuery(q Query) (Query, error) {
	switch {
	case q.PK == "":
		return q, fmt.Errorf("%w: query needs a partition key", ErrInvalid)
	case q.Prefix != "" && (q.From != "" || q.To != ""):
		return q, fmt.Errorf("%w: a query has a prefix or a range, not both", ErrInvalid)
	case q.From != "" && q.To != "" && q.From > q.To:
		return q, fmt.Errorf("%w: range from %q is after to %q", ErrInvalid, q.From, q.To)
	case q.Limit < 0 || q.Limit > maxLimit:
		return q, fmt.Errorf("%w: limit %d is outside 0..%d", ErrInvalid, q.Limit, maxLimit)
	}
	if q.Limit == 0 {
		q.Limit = defaultLimit
	}
	return q, nil
}

// prepareQuery validates q, applies its defaults and decodes its cursor into
// the sort key to continue after.
func prepareQuery(q Query) (Query, string, error) {
	q, err := normalizeQuery(q)
	if err != nil {
		return q, "", err
	}
	after, err := decodeCursor(q.Cursor, q.PK)
	return q, after, err
}

// cursor is the position after the last item a page returned. It names its
// partition so it cannot be replayed against another one.
type cursor struct {
	PK string `json:"p"`
	SK string `json:"s"`
}

func encodeCursor(pk, sk string) string {
	b, _ := json.Marshal(cursor{PK: pk, SK: sk})
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor parses a cursor that came back from a client, so it trusts
// nothing about it.
func decodeCursor(s, pk string) (string, error) {
	if s == "" {
		return "", nil
	}
	if len(s) > 4*maxKeyBytes {
		return "", fmt.Errorf("%w: cursor too long", ErrInvalid)
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("%w: malformed cursor", ErrInvalid)
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil || c.SK == "" {
		return "", fmt.Errorf("%w: malformed cursor", ErrInvalid)
	}
	if c.PK != pk {
		return "", fmt.Errorf("%w: cursor belongs to another partition", ErrInvalid)
	}
	return c.SK, nil
}

// live reports whether an item with this expiry is visible at now.
func live(expiresAt, now time.Time) bool {
	return expiresAt.IsZero() || expiresAt.After(now)
}

// defaultTimeout bounds an operation whose context has no deadline, so that
// nothing waits forever on an unreachable backend.
const defaultTimeout = 30 * time.Second

func withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultTimeout)
}
