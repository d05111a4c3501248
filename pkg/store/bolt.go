package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/conclave-ai/conclave/pkg/internal/boltgroup"
)

// Bolt is the embedded backend: one bbolt file, a bucket per table. Every
// write runs in a bbolt transaction, so conditional writes are atomic and a
// restart loses nothing that was acknowledged. Concurrent writes share
// commits (boltgroup), so a burst of them, such as thousands of agents
// registering at once, costs one fsync per round rather than one each.
type Bolt struct {
	db     *bolt.DB
	writes *boltgroup.Writer
	path   string
	now    func() time.Time
	log    *slog.Logger

	stop chan struct{}
	wg   sync.WaitGroup
}

var _ Store = (*Bolt)(nil)

// BoltOptions tune the embedded backend.
type BoltOptions struct {
	// Now is the clock expiry is judged by; time.Now when nil.
	Now func() time.Time
	// SweepInterval is how often expired items are deleted from the file;
	// 0 means one minute, negative disables sweeping.
	SweepInterval time.Duration
	// Logger receives sweep errors; slog.Default when nil.
	Logger *slog.Logger
}

// OpenBolt opens or creates the store file at path.
func OpenBolt(path string, opts BoltOptions) (*Bolt, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("store: create directory for %s: %w", path, err)
	}
	// A second process opening the same file waits on its lock, then gets
	// an error naming the holder instead of a hang.
	db, err := boltgroup.Open(path)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	b := &Bolt{db: db, writes: boltgroup.Start(db, maxGroup), path: path, now: opts.Now, log: opts.Logger, stop: make(chan struct{})}
	if b.now == nil {
		b.now = time.Now
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	interval := opts.SweepInterval
	if interval == 0 {
		interval = time.Minute
	}
	if interval > 0 {
		b.wg.Add(1)
		go b.sweepLoop(interval)
	}
	return b, nil
}

// Close stops the sweeper and closes the file.
func (b *Bolt) Close() error {
	select {
	case <-b.stop:
		return nil
	default:
	}
	close(b.stop)
	b.wg.Wait()
	b.writes.Stop()
	return b.db.Close()
}

func bucketName(table string) []byte { return []byte("table/" + table) }

// EnsureTable implements Store.
func (b *Bolt) EnsureTable(_ context.Context, t Table) error {
	if t.Name == "" {
		return fmt.Errorf("%w: table needs a name", ErrInvalid)
	}
	return b.db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketName(t.Name))
		return err
	})
}

func (b *Bolt) bucket(tx *bolt.Tx, table string) (*bolt.Bucket, error) {
	bk := tx.Bucket(bucketName(table))
	if bk == nil {
		return nil, fmt.Errorf("%w: %q in %s", ErrTableNotFound, table, b.path)
	}
	return bk, nil
}

// current returns the live item at key, or nil.
func (b *Bolt) current(bk *bolt.Bucket, key Key, now time.Time) (*Item, error) {
	v := bk.Get(boltKey(key.PK, key.SK))
	if v == nil {
		return nil, nil
	}
	it, err := decodeRecord(key, v)
	if err != nil {
		return nil, fmt.Errorf("store: %s/%s in %s: %w", key.PK, key.SK, b.path, err)
	}
	if !live(it.ExpiresAt, now) {
		return nil, nil
	}
	return &it, nil
}

// maxGroup bounds how many writes share one commit.
const maxGroup = 1000

// update runs fn in a write transaction with the table's bucket and the live
// item at key (nil when absent or expired), so that reading the item,
// checking conditions and writing are atomic. fn must check before it
// writes: a missing table or a failed condition is this call's own result,
// not a failure of the commit it shares with others.
func (b *Bolt) update(ctx context.Context, table string, key Key, fn func(bk *bolt.Bucket, cur *Item) error) error {
	var result error
	err := b.writes.Update(ctx, func(tx *bolt.Tx) error {
		result = nil
		bk, err := b.bucket(tx, table)
		if err != nil {
			result = err
			return nil
		}
		cur, err := b.current(bk, key, b.now())
		if err != nil {
			return err
		}
		err = fn(bk, cur)
		if errors.Is(err, ErrConditionFailed) {
			result = err
			return nil
		}
		return err
	})
	return b.groupResult(err, result)
}

// groupResult is the outcome of a call run through the group writer: the
// commit's error (saying so when the store is closed), else the call's own
// result, such as a failed condition.
func (b *Bolt) groupResult(err, result error) error {
	if errors.Is(err, boltgroup.ErrClosed) {
		return fmt.Errorf("store: %s is closed: %w", b.path, err)
	}
	if err != nil {
		return err
	}
	return result
}

func checkConditions(conds []Condition, cur *Item, key Key) error {
	for _, c := range conds {
		if !c.holds(cur) {
			return fmt.Errorf("%w: %s on %s/%s", ErrConditionFailed, c, key.PK, key.SK)
		}
	}
	return nil
}

// Get implements Store.
func (b *Bolt) Get(ctx context.Context, table string, key Key) (Item, error) {
	if err := validateKey(key); err != nil {
		return Item{}, err
	}
	var out Item
	err := b.db.View(func(tx *bolt.Tx) error {
		bk, err := b.bucket(tx, table)
		if err != nil {
			return err
		}
		cur, err := b.current(bk, key, b.now())
		if err != nil {
			return err
		}
		if cur == nil {
			return fmt.Errorf("%w: %s/%s in %s", ErrNotFound, key.PK, key.SK, table)
		}
		out = *cur
		return nil
	})
	return out, err
}

// Put implements Store.
func (b *Bolt) Put(ctx context.Context, table string, item Item, conds ...Condition) (Item, error) {
	if err := validateItem(item); err != nil {
		return Item{}, err
	}
	if err := validateConditions(conds); err != nil {
		return Item{}, err
	}
	err := b.update(ctx, table, item.Key, func(bk *bolt.Bucket, cur *Item) error {
		if err := checkConditions(conds, cur, item.Key); err != nil {
			return err
		}
		item.Version = 1
		if cur != nil {
			item.Version = cur.Version + 1
		}
		return bk.Put(boltKey(item.PK, item.SK), encodeRecord(item))
	})
	if err != nil {
		return Item{}, err
	}
	return item, nil
}

// Delete implements Store.
func (b *Bolt) Delete(ctx context.Context, table string, key Key, conds ...Condition) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if err := validateConditions(conds); err != nil {
		return err
	}
	return b.update(ctx, table, key, func(bk *bolt.Bucket, cur *Item) error {
		if err := checkConditions(conds, cur, key); err != nil {
			return err
		}
		return bk.Delete(boltKey(key.PK, key.SK))
	})
}

// Add implements Store.
func (b *Bolt) Add(ctx context.Context, table string, key Key, delta int64, expiresAt time.Time) (int64, error) {
	if err := validateKey(key); err != nil {
		return 0, err
	}
	var value int64
	err := b.update(ctx, table, key, func(bk *bolt.Bucket, cur *Item) error {
		it := addTo(cur, key, delta, expiresAt)
		value = it.Counter
		return bk.Put(boltKey(key.PK, key.SK), encodeRecord(it))
	})
	return value, err
}

// Query implements Store.
func (b *Bolt) Query(ctx context.Context, table string, q Query) (Page, error) {
	q, after, err := prepareQuery(q)
	if err != nil {
		return Page{}, err
	}
	lower, upper := queryBounds(q)
	var page Page
	err = b.db.View(func(tx *bolt.Tx) error {
		bk, err := b.bucket(tx, table)
		if err != nil {
			return err
		}
		now := b.now()
		c := bk.Cursor()
		var k, v []byte
		if q.Reverse {
			if after != "" {
				upper = boltKey(q.PK, after) // exclusive: stepped over below
			}
			k, v = c.Seek(upper)
			if k == nil {
				k, v = c.Last()
			} else if !bytes.Equal(k, upper) || after != "" {
				k, v = c.Prev()
			}
		} else {
			if after != "" {
				lower = boltKey(q.PK, after+"\x00") // the first key after the cursor
			}
			k, v = c.Seek(lower)
		}
		for ; k != nil && bytes.Compare(k, lower) >= 0 && bytes.Compare(k, upper) <= 0; k, v = step(c, q.Reverse) {
			key, err := splitBoltKey(k)
			if err != nil {
				return fmt.Errorf("store: key in %s: %w", b.path, err)
			}
			it, err := decodeRecord(key, v)
			if err != nil {
				return fmt.Errorf("store: %s/%s in %s: %w", key.PK, key.SK, b.path, err)
			}
			if !live(it.ExpiresAt, now) {
				continue
			}
			if len(page.Items) == q.Limit {
				page.Cursor = encodeCursor(q.PK, page.Items[len(page.Items)-1].SK)
				break
			}
			page.Items = append(page.Items, it)
		}
		return nil
	})
	return page, err
}

func step(c *bolt.Cursor, reverse bool) ([]byte, []byte) {
	if reverse {
		return c.Prev()
	}
	return c.Next()
}

// queryBounds is the inclusive key range a query covers. Sort keys are UTF-8,
// which never contains 0xff, so appending it bounds everything with a prefix.
func queryBounds(q Query) (lower, upper []byte) {
	switch {
	case q.Prefix != "":
		return boltKey(q.PK, q.Prefix), boltKey(q.PK, q.Prefix+"\xff")
	case q.To != "":
		return boltKey(q.PK, q.From), boltKey(q.PK, q.To)
	default:
		return boltKey(q.PK, q.From), boltKey(q.PK, "\xff")
	}
}

// BatchGet implements Store.
func (b *Bolt) BatchGet(ctx context.Context, table string, keys []Key) ([]Item, error) {
	if err := validateBatch(keys); err != nil {
		return nil, err
	}
	var out []Item
	err := b.db.View(func(tx *bolt.Tx) error {
		bk, err := b.bucket(tx, table)
		if err != nil {
			return err
		}
		now := b.now()
		seen := make(map[Key]bool, len(keys))
		for _, k := range keys {
			if seen[k] {
				continue
			}
			seen[k] = true
			cur, err := b.current(bk, k, now)
			if err != nil {
				return err
			}
			if cur != nil {
				out = append(out, *cur)
			}
		}
		return nil
	})
	return out, err
}

func (b *Bolt) sweepLoop(interval time.Duration) {
	defer b.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			if _, err := b.Sweep(); err != nil {
				b.log.Warn("store: sweeping expired items", "file", b.path, "error", err)
			}
		}
	}
}

// Sweep deletes expired items and returns how many it deleted. Reads never
// see expired items anyway; sweeping only reclaims space.
func (b *Bolt) Sweep() (int, error) {
	now := b.now()
	deleted := 0
	err := b.db.Update(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, bk *bolt.Bucket) error {
			c := bk.Cursor()
			for k, v := c.First(); k != nil; {
				key, err := splitBoltKey(k)
				if err != nil {
					return err
				}
				it, err := decodeRecord(key, v)
				if err != nil {
					return err
				}
				if live(it.ExpiresAt, now) {
					k, v = c.Next()
					continue
				}
				if err := c.Delete(); err != nil {
					return err
				}
				deleted++
				// Delete leaves the cursor before the next key.
				k, v = c.Seek(k)
			}
			return nil
		})
	})
	if errors.Is(err, errCorrupt) {
		return deleted, fmt.Errorf("store: sweep %s: %w", b.path, err)
	}
	return deleted, err
}

// Write implements Store: every op's table, current item and conditions
// are checked before anything is written, so a failed op leaves the shared
// commit untouched.
func (b *Bolt) Write(ctx context.Context, ops ...Op) ([]Item, error) {
	if err := validateWrite(ops); err != nil {
		return nil, err
	}
	out := make([]Item, len(ops))
	var result error
	err := b.writes.Update(ctx, func(tx *bolt.Tx) error {
		result = nil
		now := b.now()
		bks := make([]*bolt.Bucket, len(ops))
		curs := make([]*Item, len(ops))
		for i, o := range ops {
			bk, err := b.bucket(tx, o.table)
			if err != nil {
				result = err
				return nil
			}
			cur, err := b.current(bk, o.item.Key, now)
			if err != nil {
				return err
			}
			if err := checkConditions(o.conds, cur, o.item.Key); err != nil {
				result = fmt.Errorf("%w (%s)", err, o)
				return nil
			}
			bks[i], curs[i] = bk, cur
		}
		for i, o := range ops {
			k := boltKey(o.item.PK, o.item.SK)
			out[i] = Item{}
			switch o.kind {
			case opPut:
				it := o.item
				it.Version = 1
				if curs[i] != nil {
					it.Version = curs[i].Version + 1
				}
				if err := bks[i].Put(k, encodeRecord(it)); err != nil {
					return err
				}
				out[i] = it
			case opDelete:
				if err := bks[i].Delete(k); err != nil {
					return err
				}
			case opAdd:
				if err := bks[i].Put(k, encodeRecord(addTo(curs[i], o.item.Key, o.delta, o.expiresAt))); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err := b.groupResult(err, result); err != nil {
		return nil, err
	}
	return out, nil
}

// AddMany implements Store: the counters share one transaction.
func (b *Bolt) AddMany(ctx context.Context, table string, counters []Counter) ([]int64, error) {
	if err := validateCounters(table, counters); err != nil {
		return nil, err
	}
	values := make([]int64, len(counters))
	var result error
	err := b.writes.Update(ctx, func(tx *bolt.Tx) error {
		result = nil
		bk, err := b.bucket(tx, table)
		if err != nil {
			result = err
			return nil
		}
		now := b.now()
		for i, c := range counters {
			cur, err := b.current(bk, c.Key, now)
			if err != nil {
				return err
			}
			it := addTo(cur, c.Key, c.Delta, c.ExpiresAt)
			values[i] = it.Counter
			if err := bk.Put(boltKey(c.Key.PK, c.Key.SK), encodeRecord(it)); err != nil {
				return err
			}
		}
		return nil
	})
	if err := b.groupResult(err, result); err != nil {
		return nil, err
	}
	return values, nil
}

// addTo is cur (nil: absent or expired) after adding delta: a fresh counter
// starts from zero with expiresAt, an existing one keeps its expiry.
func addTo(cur *Item, key Key, delta int64, expiresAt time.Time) Item {
	if cur == nil {
		return Item{Key: key, Counter: delta, Version: 1, ExpiresAt: expiresAt}
	}
	it := *cur
	it.Counter += delta
	it.Version++
	return it
}
