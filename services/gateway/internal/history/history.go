// Package history keeps the gateway's conversations: every exchange that
// passes through it, per thread, in the store. An exchange is the client's
// message (sender, content, and what names its attachments, never their
// data), every event of the agent's answer, and how the request ended.
//
// Writes are batched per request: the client's message and the answer's
// events are buffered and written in batches (one item per batch, at most
// FlushBytes or FlushInterval old; the first, which holds the message, at
// most FirstFlush old), and the last batch, with the terminal event and
// the outcome, is written before the terminal event reaches anyone. A
// short answer so costs one write, whatever its number of events. Nothing
// of a request is shown before its message is stored.
//
// While a request is answered, its Recording also serves the live side:
// subscribers (the caller, a client replaying it or watching its thread)
// read its entries from memory, or from the store for what memory no
// longer holds, then the rest as it comes.
package history

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/store"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// Table holds every thread's entries and every agent's index of threads.
var Table = store.Table{Name: "gateway-history"}

// Errors callers test with errors.Is.
var (
	// ErrNotFound is a thread that does not exist, or that the caller may
	// not read: the two are answered alike, so as not to say which.
	ErrNotFound = errors.New("history: thread not found")
	// ErrNotOwner is a message to a thread another client started.
	ErrNotOwner = errors.New("history: the thread belongs to another client")
	// ErrBadCursor is an entry_id or page token this gateway did not issue.
	ErrBadCursor = errors.New("history: bad cursor")
)

// Defaults of Options.
const (
	DefaultFlushInterval = time.Second
	DefaultFlushBytes    = 64 << 10
	DefaultFirstFlush    = 50 * time.Millisecond
)

// Options tune a Store.
type Options struct {
	// TTL is how long an item is kept after it was written; 0 keeps it
	// until it is deleted by hand.
	TTL time.Duration
	// FlushInterval bounds how long an event waits in memory before it is
	// written; 0 means DefaultFlushInterval.
	FlushInterval time.Duration
	// FlushBytes bounds how many bytes of events wait in memory before
	// they are written; 0 means DefaultFlushBytes.
	FlushBytes int
	// FirstFlush bounds how long the client's message waits in memory
	// for the answer, to be written with it; 0 means DefaultFirstFlush.
	// Its client is shown nothing before, so it is kept short.
	FirstFlush time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Logger receives what no caller can be told.
	Logger *slog.Logger
	// Observe, when set, is told of every write: how many items, and how
	// long it took, and whether it failed (a metric).
	Observe func(items int, took time.Duration, err error)
}

// Store is the history over a store.Store whose Table exists. It also
// holds the recordings of the requests this replica is answering.
type Store struct {
	st   store.Store
	opts Options

	threads threadCache

	mu   sync.Mutex
	live map[string]*Recording // by request id
}

// New returns a Store over st.
func New(st store.Store, opts Options) *Store {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = DefaultFlushInterval
	}
	if opts.FlushBytes <= 0 {
		opts.FlushBytes = DefaultFlushBytes
	}
	if opts.FirstFlush <= 0 {
		opts.FirstFlush = min(DefaultFirstFlush, opts.FlushInterval)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{st: st, opts: opts, threads: threadCache{m: map[threadAgent]cached{}}, live: map[string]*Recording{}}
}

// FlushInterval is how long an event may wait in memory before it is
// written; a recorder flushes at least this often.
func (s *Store) FlushInterval() time.Duration { return s.opts.FlushInterval }

// FirstFlush is how long a request's client message may wait in memory
// for the answer: a recorder flushes that long after Begin.
func (s *Store) FirstFlush() time.Duration { return s.opts.FirstFlush }

func (s *Store) now() time.Time { return s.opts.Now() }

// expiry is when an item written now expires.
func (s *Store) expiry(now time.Time) time.Time {
	if s.opts.TTL <= 0 {
		return time.Time{}
	}
	return now.Add(s.opts.TTL)
}

// create writes a new item. The key is new, so the write is conditioned on
// that (one request to DynamoDB, with no read first); a condition that
// fails means an earlier try of this same write landed.
func (s *Store) create(ctx context.Context, it store.Item) error {
	_, err := s.st.Put(ctx, Table.Name, it, store.IfNotExists())
	if errors.Is(err, store.ErrConditionFailed) {
		return nil
	}
	return err
}

// ThreadInfo is what the history knows of a thread.
type ThreadInfo struct {
	ID string
	// Owner is the client that started it (auth.ClientID's name).
	Owner string
	// Agent is the first agent it reached.
	Agent   string
	Started time.Time
}

// Proto is the thread as the API shows it, for agentID.
func (t ThreadInfo) Proto(agentID string) *gatewayv1.Thread {
	return &gatewayv1.Thread{ThreadId: t.ID, AgentId: agentID, ClientId: t.Owner, StartedAt: timestamppb.New(t.Started)}
}

// threadAgent keys the cache of threads a replica has admitted messages to.
type threadAgent struct{ thread, agent string }

type cached struct {
	owner string
	until time.Time
}

// threadCache remembers, for a while, which client owns a thread and that
// its records for an agent are written, so that the next message costs no
// store call. It holds at most maxCached entries.
type threadCache struct {
	mu sync.Mutex
	m  map[threadAgent]cached
}

const (
	maxCached = 10000
	// cacheFor bounds how long an entry is trusted without the store.
	cacheFor = time.Hour
)

func (c *threadCache) get(k threadAgent, now time.Time) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.until) {
		return "", false
	}
	return e.owner, true
}

func (c *threadCache) put(k threadAgent, v cached) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCached {
		for old := range c.m { // an arbitrary one
			delete(c.m, old)
			break
		}
	}
	c.m[k] = v
}

// NewThreadID returns a fresh thread id for a message that named none.
func NewThreadID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "thread-" + hex.EncodeToString(b[:])
}

// Join admits a message of clientID for agentID to threadID: a thread that
// does not exist is started, owned by clientID; one that another client
// started is ErrNotOwner. The thread's records (and, with a TTL, their
// expiry) are kept up to date here, at most once per half TTL.
func (s *Store) Join(ctx context.Context, threadID, clientID, agentID string) error {
	now := s.now()
	k := threadAgent{threadID, agentID}
	if owner, ok := s.threads.get(k, now); ok {
		if owner != clientID {
			return ErrNotOwner
		}
		return nil
	}
	for range 3 {
		err := s.join(ctx, threadID, clientID, agentID, now)
		if !errors.Is(err, store.ErrConditionFailed) {
			return err
		}
		// Another replica wrote the same record at the same moment:
		// read what it wrote.
	}
	return fmt.Errorf("history: thread %q: lost repeated races writing its records", threadID)
}

func (s *Store) join(ctx context.Context, threadID, clientID, agentID string, now time.Time) error {
	pk := threadPK(threadID)
	meta, err := s.st.Get(ctx, Table.Name, store.Key{PK: pk, SK: metaSK})
	switch {
	case errors.Is(err, store.ErrNotFound):
		// A thread whose record expired while entries of it live on is
		// still their client's.
		if owner, err := s.entriesOwner(ctx, threadID); err != nil {
			return err
		} else if owner != "" && owner != clientID {
			return ErrNotOwner
		}
		meta = store.Item{Key: store.Key{PK: pk, SK: metaSK}, Attrs: map[string]string{
			"client": clientID, "agent": agentID, "started": strconv.FormatInt(now.UnixMilli(), 10),
		}, ExpiresAt: s.expiry(now)}
		if _, err := s.st.Put(ctx, Table.Name, meta, store.IfNotExists()); err != nil {
			return err
		}
		if err := s.writeIndex(ctx, agentID, threadID, clientID, now.UnixMilli(), now); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		if meta.Attrs["client"] != clientID {
			return ErrNotOwner
		}
		if s.due(meta, now) {
			meta.ExpiresAt = s.expiry(now)
			if _, err := s.st.Put(ctx, Table.Name, meta, store.IfVersion(meta.Version)); err != nil {
				return err
			}
		}
		if err := s.joinAgent(ctx, meta, agentID, now); err != nil {
			return err
		}
	}
	until := now.Add(cacheFor)
	if s.opts.TTL > 0 {
		until = now.Add(min(cacheFor, s.opts.TTL/4))
	}
	s.threads.put(threadAgent{threadID, agentID}, cached{owner: clientID, until: until})
	return nil
}

// due reports whether an item's expiry should be pushed back: when less
// than half the TTL is left.
func (s *Store) due(it store.Item, now time.Time) bool {
	return s.opts.TTL > 0 && it.ExpiresAt.Sub(now) < s.opts.TTL/2
}

// joinAgent makes sure agentID's index lists the thread of meta.
func (s *Store) joinAgent(ctx context.Context, meta store.Item, agentID string, now time.Time) error {
	threadID := meta.PK[len(threadPrefix):]
	client := meta.Attrs["client"]
	if meta.Attrs["agent"] == agentID {
		started, _ := strconv.ParseInt(meta.Attrs["started"], 10, 64)
		return s.refreshIndex(ctx, agentID, threadID, client, started, now)
	}
	key := store.Key{PK: meta.PK, SK: markerPrefix + agentID}
	marker, err := s.st.Get(ctx, Table.Name, key)
	if errors.Is(err, store.ErrNotFound) {
		marker = store.Item{Key: key, Attrs: map[string]string{"started": strconv.FormatInt(now.UnixMilli(), 10)}, ExpiresAt: s.expiry(now)}
		if _, err := s.st.Put(ctx, Table.Name, marker, store.IfNotExists()); err != nil {
			return err
		}
		return s.writeIndex(ctx, agentID, threadID, client, now.UnixMilli(), now)
	}
	if err != nil {
		return err
	}
	started, _ := strconv.ParseInt(marker.Attrs["started"], 10, 64)
	if s.due(marker, now) {
		marker.ExpiresAt = s.expiry(now)
		if _, err := s.st.Put(ctx, Table.Name, marker, store.IfVersion(marker.Version)); err != nil {
			return err
		}
	}
	return s.refreshIndex(ctx, agentID, threadID, client, started, now)
}

func (s *Store) indexItem(agentID, threadID, clientID string, startedMs int64, now time.Time) store.Item {
	return store.Item{Key: store.Key{PK: agentPK(agentID), SK: indexSK(startedMs, threadID)},
		Attrs: map[string]string{"client": clientID}, ExpiresAt: s.expiry(now)}
}

func (s *Store) writeIndex(ctx context.Context, agentID, threadID, clientID string, startedMs int64, now time.Time) error {
	return s.create(ctx, s.indexItem(agentID, threadID, clientID, startedMs, now))
}

// refreshIndex pushes back the expiry of an index item when it is due, or
// writes it again if it is gone (it expired with a TTL that was shorter).
func (s *Store) refreshIndex(ctx context.Context, agentID, threadID, clientID string, startedMs int64, now time.Time) error {
	it := s.indexItem(agentID, threadID, clientID, startedMs, now)
	cur, err := s.st.Get(ctx, Table.Name, it.Key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return s.create(ctx, it)
	case err != nil:
		return err
	case s.due(cur, now):
		_, err := s.st.Put(ctx, Table.Name, it, store.IfVersion(cur.Version))
		return err
	}
	return nil
}

// entriesOwner is the client whose entries a thread holds, or "" when it
// holds none: the latest entry item names it.
func (s *Store) entriesOwner(ctx context.Context, threadID string) (string, error) {
	page, err := s.st.Query(ctx, Table.Name, store.Query{PK: threadPK(threadID), From: entryPrefix, To: entriesEnd, Reverse: true, Limit: 1})
	if err != nil || len(page.Items) == 0 {
		return "", err
	}
	return page.Items[0].Attrs["client"], nil
}

// Thread returns what the history knows of threadID, or ErrNotFound.
func (s *Store) Thread(ctx context.Context, threadID string) (ThreadInfo, error) {
	meta, err := s.st.Get(ctx, Table.Name, store.Key{PK: threadPK(threadID), SK: metaSK})
	if errors.Is(err, store.ErrNotFound) {
		// The thread's record expired before its last entries.
		owner, err := s.entriesOwner(ctx, threadID)
		if err != nil {
			return ThreadInfo{}, err
		}
		if owner == "" {
			return ThreadInfo{}, ErrNotFound
		}
		return ThreadInfo{ID: threadID, Owner: owner}, nil
	}
	if err != nil {
		return ThreadInfo{}, err
	}
	started, _ := strconv.ParseInt(meta.Attrs["started"], 10, 64)
	return ThreadInfo{ID: threadID, Owner: meta.Attrs["client"], Agent: meta.Attrs["agent"], Started: time.UnixMilli(started)}, nil
}

// maxThreadScan bounds the index items one Threads call reads to fill a
// page for one client.
const maxThreadScan = 1000

// Threads lists agentID's threads, newest first: all of them when clientID
// is "", else only clientID's. The page may hold fewer than limit threads
// while next is not empty, when other clients' threads were skipped.
func (s *Store) Threads(ctx context.Context, agentID, clientID string, limit int, token string) (threads []ThreadInfo, next string, err error) {
	q := store.Query{PK: agentPK(agentID), Reverse: true}
	var before string
	if token != "" {
		if before, err = parseThreadsToken(token); err != nil {
			return nil, "", err
		}
		q.To = before
	}
	scanned := 0
	for {
		q.Limit = min(maxThreadScan-scanned, limit+1)
		page, err := s.st.Query(ctx, Table.Name, q)
		if err != nil {
			return nil, "", err
		}
		for _, it := range page.Items {
			if it.SK == before {
				continue // the last item of the previous page: To is inclusive
			}
			if len(threads) == limit {
				return threads, hex.EncodeToString([]byte(before)), nil
			}
			scanned++
			before = it.SK
			ms, thread, ok := parseIndexSK(it.SK)
			if !ok || (clientID != "" && it.Attrs["client"] != clientID) {
				continue
			}
			threads = append(threads, ThreadInfo{ID: thread, Owner: it.Attrs["client"], Started: time.UnixMilli(ms)})
		}
		if page.Cursor == "" {
			return threads, "", nil
		}
		if scanned >= maxThreadScan {
			return threads, hex.EncodeToString([]byte(before)), nil
		}
		q.Cursor = page.Cursor
	}
}

// parseThreadsToken is the index sort key a Threads page token, from a
// client, names: the last one its page read.
func parseThreadsToken(token string) (string, error) {
	b, err := hex.DecodeString(token)
	if err != nil || len(b) == 0 || len(b) > 2*MaxEntryIDBytes {
		return "", ErrBadCursor
	}
	if _, _, ok := parseIndexSK(string(b)); !ok {
		return "", ErrBadCursor
	}
	return string(b), nil
}

// AttachmentRefs names attachments without their data.
func AttachmentRefs(atts []*covenpb.FileAttachment) []*gatewayv1.AttachmentRef {
	refs := make([]*gatewayv1.AttachmentRef, 0, len(atts))
	for _, a := range atts {
		refs = append(refs, fileRef(a.GetFilename(), a.GetMimeType(), a.GetData()))
	}
	return refs
}

func fileRef(name, mime string, data []byte) *gatewayv1.AttachmentRef {
	d := sha256.Sum256(data)
	return &gatewayv1.AttachmentRef{Filename: name, MimeType: mime, Size: int32(len(data)), Sha256: hex.EncodeToString(d[:])}
}
