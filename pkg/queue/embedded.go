package queue

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/conclave-ai/conclave/pkg/internal/boltgroup"
)

// Embedded is the Queue backend for `conclave dev` and single-node use: all
// queues in one bbolt file, which survives restarts. Every change is
// committed (fsynced) before the call returns, so an acknowledged send is
// never lost.
//
// Commits are grouped: calls that arrive while a commit is in progress share
// the next one, so many concurrent consumers cost one fsync per round rather
// than one each, without adding latency to a lone caller.
type Embedded struct {
	db   *bolt.DB
	path string
	// now is the clock for visibility, delay and retention; tests replace
	// it to reach retention limits without waiting.
	now func() time.Time

	writes    *boltgroup.Writer
	closing   chan struct{}
	closeOnce sync.Once
	closeErr  error

	mu   sync.Mutex
	defs map[string]Definition
	// wake holds, per queue, a channel closed when messages may have
	// become available, so long polls sleep instead of polling the file.
	wake map[string]chan struct{}
}

var _ Queue = (*Embedded)(nil)

// The file holds a bucket of definitions (name → JSON) and a bucket per
// queue with two nested buckets: messages by sequence number, and an index
// of (visible-at, sequence) keys, in time order, that receives scan.
var (
	bucketDefs = []byte("definitions")
	bucketMsgs = []byte("messages")
	bucketVis  = []byte("visible")
)

func queueBucket(name string) []byte { return []byte("queue/" + name) }

// maxGroup bounds how many calls share one commit, so a burst cannot make a
// single transaction arbitrarily large.
const maxGroup = 256

// maxScan bounds how many due messages one receive looks at, so a backlog
// of expired messages is cleared over several short transactions rather
// than one long one.
const maxScan = 1000

// errClosed is returned by calls made after Close.
var errClosed = errors.New("queue: embedded backend is closed")

// OpenEmbedded opens or creates the queue file at path. Only one process
// may have it open; another waits up to 5s and then fails.
func OpenEmbedded(path string) (*Embedded, error) {
	db, err := boltgroup.Open(path)
	if err != nil {
		return nil, fmt.Errorf("queue: open %s: %w", path, err)
	}
	e := &Embedded{
		db:      db,
		path:    path,
		now:     time.Now,
		closing: make(chan struct{}),
		defs:    map[string]Definition{},
		wake:    map[string]chan struct{}{},
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketDefs)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			var d Definition
			if err := json.Unmarshal(v, &d); err != nil {
				return fmt.Errorf("definition of %q: %w", k, err)
			}
			e.defs[string(k)] = d
			return nil
		})
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("queue: load %s: %w", path, err)
	}
	e.writes = boltgroup.Start(db, maxGroup)
	return e, nil
}

// Close stops the backend and closes the file. Long polls in progress
// return an error.
func (e *Embedded) Close() error {
	e.closeOnce.Do(func() {
		close(e.closing)
		e.writes.Stop()
		e.closeErr = e.db.Close()
	})
	return e.closeErr
}

// update runs fn in a write transaction shared with the calls that queue up
// meanwhile. fn may run twice (see boltgroup), so it must set its results
// from scratch each time.
func (e *Embedded) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	err := e.writes.Update(ctx, fn)
	if errors.Is(err, boltgroup.ErrClosed) {
		return errClosed
	}
	return err
}

// definition returns the queue's definition, or ErrQueueNotFound.
func (e *Embedded) definition(queue string) (Definition, error) {
	if err := validName(queue); err != nil {
		return Definition{}, fmt.Errorf("queue: %w", err)
	}
	e.mu.Lock()
	d, ok := e.defs[queue]
	e.mu.Unlock()
	if !ok {
		return d, fmt.Errorf("queue: %q at %s: %w", queue, e.path, ErrQueueNotFound)
	}
	return d, nil
}

// waiter returns a channel that is closed by the next notify(queue).
func (e *Embedded) waiter(queue string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch, ok := e.wake[queue]
	if !ok {
		ch = make(chan struct{})
		e.wake[queue] = ch
	}
	return ch
}

// notify wakes the long polls of queue after messages may have become
// visible.
func (e *Embedded) notify(queue string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch, ok := e.wake[queue]; ok {
		close(ch)
		delete(e.wake, queue)
	}
}

// Ensure implements Queue.
func (e *Embedded) Ensure(ctx context.Context, def Definition) error {
	def, err := def.normalized()
	if err != nil {
		return fmt.Errorf("queue: ensure: %w", err)
	}
	defs := []Definition{def}
	if def.MaxReceiveCount > 0 {
		defs = append(defs, def.dlqDefinition())
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	err = e.update(ctx, func(tx *bolt.Tx) error {
		for _, d := range defs {
			raw, err := json.Marshal(d)
			if err != nil {
				return err
			}
			q, err := tx.CreateBucketIfNotExists(queueBucket(d.Name))
			if err != nil {
				return err
			}
			if _, err := q.CreateBucketIfNotExists(bucketMsgs); err != nil {
				return err
			}
			if _, err := q.CreateBucketIfNotExists(bucketVis); err != nil {
				return err
			}
			if err := tx.Bucket(bucketDefs).Put([]byte(d.Name), raw); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("queue: ensure %q at %s: %w", def.Name, e.path, err)
	}
	e.mu.Lock()
	for _, d := range defs {
		e.defs[d.Name] = d
	}
	e.mu.Unlock()
	return nil
}

// Send implements Queue. All messages are committed together, so a Send
// that fails sent nothing.
func (e *Embedded) Send(ctx context.Context, queue string, msgs ...Outgoing) ([]string, error) {
	ps, err := prepare(ctx, msgs)
	if err != nil {
		return nil, fmt.Errorf("queue: send to %q: %w", queue, err)
	}
	def, err := e.definition(queue)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	ids := make([]string, len(ps))
	for i := range ids {
		ids[i] = newID()
	}
	now := e.now().UnixNano()
	err = e.update(ctx, func(tx *bolt.Tx) error {
		q := openQueue(tx, queue)
		for i, p := range ps {
			delay := p.delay
			if delay == 0 {
				delay = def.Delay
			}
			r := &record{id: ids[i], body: []byte(p.body), attrs: p.attrs, sentAt: now, visibleAt: now + int64(delay)}
			if err := q.add(r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: send to %q at %s: %w", queue, e.path, err)
	}
	e.notify(queue)
	return ids, nil
}

// Receive implements Queue. A long poll sleeps until a send or a visibility
// change wakes it, or until the earliest delayed or in-flight message is due.
func (e *Embedded) Receive(ctx context.Context, queue string, opts ReceiveOptions) ([]Message, error) {
	opts, err := opts.normalized()
	if err != nil {
		return nil, fmt.Errorf("queue: receive from %q: %w", queue, err)
	}
	def, err := e.definition(queue)
	if err != nil {
		return nil, err
	}
	if opts.Visibility == 0 {
		opts.Visibility = def.VisibilityTimeout
	}
	ctx, cancel := withDeadline(ctx, opts.Wait)
	defer cancel()
	deadline := time.Now().Add(opts.Wait)
	for {
		wake := e.waiter(queue)
		msgs, next, err := e.receiveOnce(ctx, def, opts)
		if err != nil {
			return nil, fmt.Errorf("queue: receive from %q at %s: %w", queue, e.path, err)
		}
		left := time.Until(deadline)
		if len(msgs) > 0 || left <= 0 {
			return msgs, nil
		}
		if next != 0 {
			if due := time.Duration(next - e.now().UnixNano()); due < left {
				left = max(due, time.Millisecond)
			}
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("queue: receive from %q at %s: %w", queue, e.path, ctx.Err())
		case <-e.closing:
			t.Stop()
			return nil, errClosed
		}
		t.Stop()
	}
}

// receiveOnce receives what is visible now. It also drops expired messages
// and dead-letters those over the receive limit as it meets them, which is
// when SQS does it too. next is when the earliest remaining message becomes
// visible (0 for none).
func (e *Embedded) receiveOnce(ctx context.Context, def Definition, opts ReceiveOptions) (msgs []Message, next int64, err error) {
	deadLettered := false
	err = e.update(ctx, func(tx *bolt.Tx) error {
		msgs, next, deadLettered = nil, 0, false
		now := e.now().UnixNano()
		q := openQueue(tx, def.Name)
		// Collect first and change afterwards: a re-hidden message gets a
		// later index key, which the cursor must not meet again.
		type pick struct {
			seq uint64
			r   *record
		}
		var picks []pick
		delivered := 0
		c := q.vis.Cursor()
		for k, _ := c.First(); k != nil && delivered < opts.Max && len(picks) < maxScan; k, _ = c.Next() {
			at, seq := splitVisKey(k)
			if at > now {
				break
			}
			r, err := q.get(seq)
			if err != nil {
				return err
			}
			picks = append(picks, pick{seq, r})
			if !e.expired(def, r, now) && !overLimit(def, r) {
				delivered++
			}
		}
		for _, p := range picks {
			if err := q.remove(p.seq, p.r); err != nil {
				return err
			}
			switch {
			case e.expired(def, p.r, now):
				// Removing it is all there is to do.
			case overLimit(def, p.r):
				// Same ID and send time in the dead-letter queue, as SQS
				// keeps them; its retention counts from the original send.
				dlq := openQueue(tx, def.DeadLetterQueue)
				if dlq.msgs == nil {
					return fmt.Errorf("dead-letter queue %q does not exist", def.DeadLetterQueue)
				}
				p.r.receives, p.r.receipt, p.r.visibleAt = 0, 0, now
				if err := dlq.add(p.r); err != nil {
					return err
				}
				deadLettered = true
			default:
				p.r.receives++
				p.r.receipt = newReceipt()
				p.r.visibleAt = now + int64(opts.Visibility)
				if err := q.put(p.seq, p.r); err != nil {
					return err
				}
				msgs = append(msgs, Message{
					ID:            p.r.id,
					Body:          p.r.body,
					Attributes:    p.r.attrs,
					ReceiptHandle: encodeReceipt(p.seq, p.r.receipt),
					ReceiveCount:  int(p.r.receives),
					SentAt:        time.Unix(0, p.r.sentAt),
				})
			}
		}
		if k, _ := q.vis.Cursor().First(); k != nil {
			next, _ = splitVisKey(k)
		}
		return nil
	})
	if deadLettered {
		e.notify(def.DeadLetterQueue)
	}
	return msgs, next, err
}

func (e *Embedded) expired(def Definition, r *record, now int64) bool {
	return now-r.sentAt >= int64(def.Retention)
}

// overLimit tells whether receiving r once more would exceed the queue's
// MaxReceiveCount, which sends it to the dead-letter queue instead.
func overLimit(def Definition, r *record) bool {
	return def.MaxReceiveCount > 0 && int(r.receives) >= def.MaxReceiveCount
}

// Delete implements Queue.
func (e *Embedded) Delete(ctx context.Context, queue, receiptHandle string) error {
	seq, receipt, err := decodeReceipt(receiptHandle)
	if err != nil {
		return fmt.Errorf("queue: delete from %q: %w", queue, err)
	}
	if _, err := e.definition(queue); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	err = e.update(ctx, func(tx *bolt.Tx) error {
		q := openQueue(tx, queue)
		r, err := q.get(seq)
		if err != nil || r == nil || r.receipt != receipt {
			return err
		}
		return q.remove(seq, r)
	})
	if err != nil {
		return fmt.Errorf("queue: delete from %q at %s: %w", queue, e.path, err)
	}
	return nil
}

// ChangeVisibility implements Queue.
func (e *Embedded) ChangeVisibility(ctx context.Context, queue, receiptHandle string, d time.Duration) error {
	d = ceilSeconds(d)
	if err := checkRange("visibility", d, 0, MaxVisibility); err != nil {
		return fmt.Errorf("queue: change visibility in %q: %w", queue, err)
	}
	seq, receipt, err := decodeReceipt(receiptHandle)
	if err != nil {
		return fmt.Errorf("queue: change visibility in %q: %w", queue, err)
	}
	if _, err := e.definition(queue); err != nil {
		return err
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	inFlight := false
	err = e.update(ctx, func(tx *bolt.Tx) error {
		now := e.now().UnixNano()
		q := openQueue(tx, queue)
		r, err := q.get(seq)
		// A stale handle is reported through inFlight rather than as an
		// error, which would make the writer rerun the whole group.
		if inFlight = err == nil && r != nil && r.receipt == receipt && r.visibleAt > now; !inFlight {
			return err
		}
		if err := q.remove(seq, r); err != nil {
			return err
		}
		r.visibleAt = now + int64(d)
		return q.put(seq, r)
	})
	switch {
	case err != nil:
		return fmt.Errorf("queue: change visibility in %q at %s: %w", queue, e.path, err)
	case !inFlight:
		return fmt.Errorf("queue: change visibility in %q at %s: %w", queue, e.path, ErrInvalidReceipt)
	}
	if d == 0 {
		e.notify(queue)
	}
	return nil
}

// Redrive implements Queue. Unlike SQS it moves the messages in one
// transaction, so each is moved exactly once.
func (e *Embedded) Redrive(ctx context.Context, dlq, source string) (int, error) {
	if dlq == source {
		return 0, fmt.Errorf("queue: redrive %q: %w: source and dead-letter queue are the same", dlq, ErrInvalid)
	}
	dlqDef, err := e.definition(dlq)
	if err != nil {
		return 0, err
	}
	if _, err := e.definition(source); err != nil {
		return 0, err
	}
	ctx, cancel := withDeadline(ctx, 0)
	defer cancel()
	moved := 0
	err = e.update(ctx, func(tx *bolt.Tx) error {
		moved = 0
		now := e.now().UnixNano()
		from, to := openQueue(tx, dlq), openQueue(tx, source)
		type pick struct {
			seq uint64
			r   *record
		}
		var picks []pick
		c := from.vis.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			at, seq := splitVisKey(k)
			if at > now {
				break
			}
			r, err := from.get(seq)
			if err != nil {
				return err
			}
			picks = append(picks, pick{seq, r})
		}
		for _, p := range picks {
			if err := from.remove(p.seq, p.r); err != nil {
				return err
			}
			if e.expired(dlqDef, p.r, now) {
				continue
			}
			// A new message, as the SQS backend's redrive sends it anew.
			*p.r = record{id: newID(), body: p.r.body, attrs: p.r.attrs, sentAt: now, visibleAt: now}
			if err := to.add(p.r); err != nil {
				return err
			}
			moved++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("queue: redrive %q to %q at %s: %w", dlq, source, e.path, err)
	}
	e.notify(source)
	return moved, nil
}

// boltQueue is one queue's buckets inside a transaction.
type boltQueue struct {
	msgs, vis *bolt.Bucket
}

// openQueue returns the queue's buckets; both are nil if it was never
// ensured in this file.
func openQueue(tx *bolt.Tx, name string) boltQueue {
	b := tx.Bucket(queueBucket(name))
	if b == nil {
		return boltQueue{}
	}
	return boltQueue{msgs: b.Bucket(bucketMsgs), vis: b.Bucket(bucketVis)}
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// visKey orders the index by visibility time, then by send order.
func visKey(at int64, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(at)), seq)
}

func splitVisKey(k []byte) (at int64, seq uint64) {
	if len(k) != 16 {
		return 0, 0
	}
	return int64(binary.BigEndian.Uint64(k)), binary.BigEndian.Uint64(k[8:])
}

// get returns the record with sequence number seq, or nil if there is none.
func (q boltQueue) get(seq uint64) (*record, error) {
	raw := q.msgs.Get(seqKey(seq))
	if raw == nil {
		return nil, nil
	}
	r, err := decodeRecord(raw)
	if err != nil {
		return nil, fmt.Errorf("message %d: %w", seq, err)
	}
	return r, nil
}

func (q boltQueue) put(seq uint64, r *record) error {
	if err := q.msgs.Put(seqKey(seq), r.encode()); err != nil {
		return err
	}
	return q.vis.Put(visKey(r.visibleAt, seq), nil)
}

// add stores r under a new sequence number.
func (q boltQueue) add(r *record) error {
	seq, err := q.msgs.NextSequence()
	if err != nil {
		return err
	}
	return q.put(seq, r)
}

func (q boltQueue) remove(seq uint64, r *record) error {
	if err := q.vis.Delete(visKey(r.visibleAt, seq)); err != nil {
		return err
	}
	return q.msgs.Delete(seqKey(seq))
}

// newID returns a random UUID (version 4), the form of SQS message IDs.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:8], b[8:10], b[10:12], b[12:16])
}

// newReceipt returns a non-zero receipt. It only has to differ from the
// previous receipt of the same message, so a fast generator is enough.
func newReceipt() uint64 {
	for {
		if r := mrand.Uint64(); r != 0 {
			return r
		}
	}
}
