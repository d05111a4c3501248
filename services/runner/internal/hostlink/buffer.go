package hostlink

import (
	"context"
	"errors"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

// errHostStopping ends a push while agent-host is stopping.
var errHostStopping = errors.New("hostlink: agent-host is stopping")

// eventBuffer holds the events the runner has not acknowledged, in seq
// order, up to max bytes: a push that does not fit waits, which stops the
// agent's stdout from being read (backpressure) rather than dropping
// anything. One event larger than max is let in alone.
type eventBuffer struct {
	max int

	mu      sync.Mutex
	events  []*runnerv1.HostEvent
	sizes   []int
	size    int
	nextSeq int64
	// changed is closed and replaced on every push and ack.
	changed chan struct{}
	stopped chan struct{}
	stop    sync.Once
}

func newEventBuffer(max int) *eventBuffer {
	return &eventBuffer{max: max, nextSeq: 1, changed: make(chan struct{}), stopped: make(chan struct{})}
}

func (b *eventBuffer) signal() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// maxEventBytes leaves room in a message for its envelope and seq.
const maxEventBytes = MaxMessageBytes - 4<<10

// fitEvent cuts an event that would not fit in one message: an update's
// raw JSON is left out (over half the room) and its text cut, a log line's
// text cut. It reports whether it cut anything.
func fitEvent(e *runnerv1.HostEvent) bool {
	if proto.Size(e) <= maxEventBytes {
		return false
	}
	switch k := e.GetKind().(type) {
	case *runnerv1.HostEvent_Update:
		u := k.Update
		if len(u.Raw) > maxEventBytes/2 {
			u.Raw = nil
		}
		u.Text = truncateUTF8(u.Text, max(0, maxEventBytes/2-len(u.Raw)))
	case *runnerv1.HostEvent_Log:
		k.Log.Text = truncateUTF8(k.Log.Text, maxEventBytes/2)
	}
	return true
}

// truncateUTF8 cuts s to at most n bytes, at a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// push numbers e and appends it, waiting for room.
func (b *eventBuffer) push(ctx context.Context, e *runnerv1.HostEvent) error {
	fitEvent(e)
	n := proto.Size(e) + 10 // the seq, at most
	for {
		b.mu.Lock()
		if len(b.events) == 0 || b.size+n <= b.max {
			e.Seq = b.nextSeq
			b.nextSeq++
			b.events = append(b.events, e)
			b.sizes = append(b.sizes, n)
			b.size += n
			b.signal()
			b.mu.Unlock()
			return nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-b.stopped:
			return errHostStopping
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ack drops the events up to seq.
func (b *eventBuffer) ack(seq int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := 0
	for i < len(b.events) && b.events[i].GetSeq() <= seq {
		b.size -= b.sizes[i]
		i++
	}
	if i == 0 {
		return
	}
	b.events, b.sizes = b.events[i:], b.sizes[i:]
	b.signal()
}

// from returns the events from seq on, and a channel closed on the next
// change.
func (b *eventBuffer) from(seq int64) ([]*runnerv1.HostEvent, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := 0
	for i < len(b.events) && b.events[i].GetSeq() < seq {
		i++
	}
	return append([]*runnerv1.HostEvent(nil), b.events[i:]...), b.changed
}

// pending is the number of events not acknowledged, and a channel closed
// on the next change.
func (b *eventBuffer) pending() (int, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.events), b.changed
}

// firstSeq is the seq of the oldest event not acknowledged, or the next
// one's.
func (b *eventBuffer) firstSeq() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.events) > 0 {
		return b.events[0].GetSeq()
	}
	return b.nextSeq
}

// close ends pushes waiting for room.
func (b *eventBuffer) close() { b.stop.Do(func() { close(b.stopped) }) }
