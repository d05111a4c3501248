// Package boltgroup commits bbolt write transactions in groups: calls that
// arrive while a commit is in progress share the next one, so many
// concurrent writers cost one fsync per round rather than one each, without
// adding latency to a lone caller (bbolt's own Batch waits up to 10ms for
// company). The embedded store and the embedded queue both write through it.
package boltgroup

import (
	"context"
	"errors"
	"runtime"

	bolt "go.etcd.io/bbolt"
)

// ErrClosed is returned by calls made after Stop.
var ErrClosed = errors.New("boltgroup: writer is stopped")

// Writer runs every write transaction of one bbolt file.
type Writer struct {
	db      *bolt.DB
	max     int
	ops     chan op
	closing chan struct{}
	stopped chan struct{}
}

type op struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// Start starts the writer of db; at most maxGroup calls share a commit, so a
// burst cannot make one transaction arbitrarily large.
func Start(db *bolt.DB, maxGroup int) *Writer {
	w := &Writer{db: db, max: maxGroup, ops: make(chan op), closing: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// Update runs fn in a write transaction shared with the calls that queue up
// meanwhile. fn may run twice (when another call of its group fails, each is
// run again alone), so it must set its results from scratch each time; and
// a call that fails without having written should record its own error and
// return nil, so that it does not make its group run again.
func (w *Writer) Update(ctx context.Context, fn func(*bolt.Tx) error) error {
	o := op{fn: fn, done: make(chan error, 1)}
	select {
	case w.ops <- o:
	case <-w.closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	// Once handed over the commit is not abandoned: it is short, and its
	// caller must learn whether it happened.
	return <-o.done
}

// Stop ends the writer once the group in progress is committed; later calls
// fail with ErrClosed.
func (w *Writer) Stop() {
	select {
	case <-w.closing:
	default:
		close(w.closing)
	}
	<-w.stopped
}

func (w *Writer) run() {
	defer close(w.stopped)
	for {
		var group []op
		select {
		case o := <-w.ops:
			group = append(group, o)
		case <-w.closing:
			return
		}
		// Let the goroutines that are about to write queue up first: under
		// load a group grows several times larger (a sixth of the commits
		// for the gateway's history, measured in bench/gateway), while a
		// lone caller loses nothing, since nothing else is waiting to run.
		runtime.Gosched()
	more:
		for len(group) < w.max {
			select {
			case o := <-w.ops:
				group = append(group, o)
			default:
				break more
			}
		}
		w.commit(group)
	}
}

// commit runs a group in one transaction. If any call fails, the whole
// transaction is rolled back and each call is run in its own, so that a
// failing call neither undoes the others nor gets their result.
func (w *Writer) commit(group []op) {
	err := w.db.Update(func(tx *bolt.Tx) error {
		for _, o := range group {
			if err := o.fn(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil && len(group) > 1 {
		for _, o := range group {
			o.done <- w.db.Update(o.fn)
		}
		return
	}
	for _, o := range group {
		o.done <- err
	}
}
