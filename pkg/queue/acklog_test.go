package queue_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
)

// ackLog wraps a Queue to check the promise at-least-once delivery makes
// about deletes: a message deleted while it is in flight under the handle
// deleted with is never delivered again.
//
// A delete that lands after the handle's visibility ran out is another
// matter: the message may already be back in the queue or in another
// consumer's hands, so the delete succeeds without deleting (as in SQS; on
// fauxqs as soon as the visibility ends), and the message comes back. A
// consumer's heartbeat that runs late under load does exactly that. So
// ackLog counts a delete as an acknowledgement only when it returned before
// the earliest moment the handle could have expired: the start of the
// Receive that gave it (or of the last ChangeVisibility that extended it)
// plus the visibility asked for. Any delivery of an acknowledged message
// afterwards is a redelivery of a deleted message.
type ackLog struct {
	queue.Queue
	// visibility is the queue's own timeout, for receives that ask for none.
	visibility time.Duration

	mu sync.Mutex
	// handles holds each receipt handle's delivery and the earliest moment
	// it can have left flight.
	handles map[string]delivery
	// acked holds the acknowledged deliveries by message ID.
	acked map[string]acked
	late  int
	// redelivered describes each delivery of an acknowledged message.
	redelivered []string
}

type delivery struct {
	id      string
	count   int
	expires time.Time
}

type acked struct {
	count int
	at    time.Time
}

func newAckLog(q queue.Queue, visibility time.Duration) *ackLog {
	return &ackLog{Queue: q, visibility: visibility, handles: map[string]delivery{}, acked: map[string]acked{}}
}

func (l *ackLog) Receive(ctx context.Context, name string, opts queue.ReceiveOptions) ([]queue.Message, error) {
	start := time.Now()
	msgs, err := l.Queue.Receive(ctx, name, opts)
	visibility := opts.Visibility
	if visibility == 0 {
		visibility = l.visibility
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		l.handles[m.ReceiptHandle] = delivery{id: m.ID, count: m.ReceiveCount, expires: start.Add(visibility)}
		// A later receive count, or a receive begun after the delete
		// returned, cannot be a delivery that raced with the delete.
		if a, ok := l.acked[m.ID]; ok && (m.ReceiveCount > a.count || start.After(a.at)) {
			l.redelivered = append(l.redelivered, fmt.Sprintf("%s %q (receive %d, deleted after receive %d)", m.ID, m.Body, m.ReceiveCount, a.count))
		}
	}
	return msgs, err
}

func (l *ackLog) ChangeVisibility(ctx context.Context, name, receiptHandle string, d time.Duration) error {
	start := time.Now()
	err := l.Queue.ChangeVisibility(ctx, name, receiptHandle, d)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.handles[receiptHandle]; ok {
		// The message was in flight under the handle, so it stays so for
		// at least d after the call began; 0 releases it.
		h.expires = start.Add(d)
		l.handles[receiptHandle] = h
	}
	return nil
}

func (l *ackLog) Delete(ctx context.Context, name, receiptHandle string) error {
	err := l.Queue.Delete(ctx, name, receiptHandle)
	returned := time.Now()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.handles[receiptHandle]
	switch {
	case !ok:
	case returned.Before(h.expires):
		l.acked[h.id] = acked{count: h.count, at: returned}
	default:
		l.late++
	}
	return nil
}

// result tells how many deletes were acknowledgements, how many may have
// lost against a visibility expiry, and the redeliveries of acknowledged
// messages.
func (l *ackLog) result() (acks, late int, redelivered []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked), l.late, append([]string(nil), l.redelivered...)
}
