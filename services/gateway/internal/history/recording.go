package history

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/store"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// Exchange is a request as its client sent it.
type Exchange struct {
	ThreadID, RequestID, AgentID string
	// ClientID is the thread's owner, who sent it.
	ClientID        string
	Sender, Content string
	Attachments     []*covenpb.FileAttachment
	// Start is when the request was accepted (zero: now); with RequestID
	// it makes the request's place in the thread, MessageRef.
	Start time.Time
}

// MessageRef is the reference of the client message of requestID, accepted
// at start: what Begin will record it as.
func MessageRef(requestID string, start time.Time) EntryRef {
	return EntryRef{k: entryKey{ms: start.UnixMilli(), requestID: requestID}}
}

// dataCap bounds the entries' bytes in one item, inside DynamoDB's 400 KB
// item limit with room for the key and attributes.
const dataCap = 380_000

// maxWindowBytes bounds the stored entries a recording keeps in memory for
// subscribers that have not read them yet; past it they read them from
// the store.
const maxWindowBytes = 1 << 20

// Recording is one request's exchange while this replica answers it: it
// batches the entries' writes, and serves them to subscribers.
//
// Append, Flush, End, Stored, Pending and SetAttached are called by one
// goroutine at a time, the request's recorder; subscribers call Subscribe
// and their Subscription's methods.
type Recording struct {
	s                                   *Store
	threadID, requestID, agentID, owner string
	ms                                  int64

	// next, pending, pendingN and stored are the recorder's own;
	// flushedTo is written by the recorder only.
	next     uint32 // seq of the next entry
	pending  []byte // the encoded entries from seq flushedTo on, in a row
	pendingN uint32 // how many pending holds
	stored   bool   // the client's message is stored

	mu          sync.Mutex
	flushedTo   uint32 // entries before it are stored
	window      []windowEntry
	windowStart uint32 // seq of window[0]
	windowBytes int
	subs        map[*Subscription]struct{} // made by the first Subscribe
	attached    bool                       // the recorder relays the answer to its own client
	ended       bool
	endErr      error
}

// windowEntry is an entry kept in memory, and about what it takes there.
type windowEntry struct {
	e    *gatewayv1.ThreadEntry
	size int
}

const (
	// pendingCap is what a recording's batch buffer starts with: a short
	// exchange's entries, so that they are encoded into it without it
	// growing.
	pendingCap = 2 << 10
	// windowCap is how many entries a window starts with room for.
	windowCap = 16
)

// Begin starts the recording of ex: its client message, and then the
// answer. Nothing is written yet: the message is written with the first
// batch of the answer (by Flush or End), and until it is stored no
// subscriber is shown anything of the request, nor should its client be
// (Stored says when): a client is never told of a message that a replica
// dying at that moment would lose.
func (s *Store) Begin(ex Exchange) (*Recording, error) {
	now := ex.Start
	if now.IsZero() {
		now = s.now()
	}
	r := &Recording{s: s, threadID: ex.ThreadID, requestID: ex.RequestID, agentID: ex.AgentID, owner: ex.ClientID, ms: now.UnixMilli()}
	msg := &gatewayv1.ThreadEntry{Time: timestamppb.New(now), Entry: &gatewayv1.ThreadEntry_Message{Message: &gatewayv1.ClientMessage{
		Sender: ex.Sender, Content: ex.Content, Attachments: AttachmentRefs(ex.Attachments), ClientId: ex.ClientID,
	}}}
	size := r.record(msg)
	if len(r.pending) > maxParts*dataCap {
		return nil, fmt.Errorf("history: a message of %d bytes is larger than the history keeps", len(r.pending))
	}
	r.window = append(make([]windowEntry, 0, windowCap), windowEntry{msg, size})
	r.windowBytes = size
	s.mu.Lock()
	s.live[ex.RequestID] = r
	s.mu.Unlock()
	return r, nil
}

// Live returns the recording of a request this replica is answering, or
// nil.
func (s *Store) Live(requestID string) *Recording {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[requestID]
}

func (s *Store) forget(r *Recording) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live[r.requestID] == r {
		delete(s.live, r.requestID)
	}
}

// Message is the entry id of the request's client message: its reference.
func (r *Recording) Message() EntryRef {
	return EntryRef{k: entryKey{ms: r.ms, requestID: r.requestID}}
}

// ThreadID is the request's thread.
func (r *Recording) ThreadID() string { return r.threadID }

// record makes e, which holds only what is stored (time, payload, file),
// the next entry: it encodes it onto pending, then sets its ids. It
// returns about what e takes in memory: its encoding, and an event's file
// data, which the encoding leaves out.
func (r *Recording) record(e *gatewayv1.ThreadEntry) int {
	if r.pending == nil {
		r.pending = make([]byte, 0, pendingCap)
	}
	n := len(r.pending)
	r.pending = appendEntry(r.pending, e)
	r.pendingN++
	e.EntryId = entryKey{ms: r.ms, requestID: r.requestID, seq: r.next}.String()
	e.ThreadId, e.RequestId, e.AgentId = r.threadID, r.requestID, r.agentID
	r.next++
	return len(r.pending) - n + len(e.GetEvent().GetFile().GetData())
}

// eventParts are an event entry's parts, allocated together: one
// allocation per event relayed instead of three.
type eventParts struct {
	e    gatewayv1.ThreadEntry
	ev   gatewayv1.ThreadEntry_Event
	time timestamppb.Timestamp
}

// eventEntry is ev as an entry, whole: for subscribers (the store keeps a
// file without its data, see appendEntry).
func eventEntry(ev *covenpb.MessageResponse, at time.Time) *gatewayv1.ThreadEntry {
	p := &eventParts{}
	p.time.Seconds, p.time.Nanos = at.Unix(), int32(at.Nanosecond())
	p.ev.Event = ev
	e := &p.e
	e.Time, e.Entry = &p.time, &p.ev
	if f := ev.GetFile(); f != nil {
		e.File = fileRef(f.GetFilename(), f.GetMimeType(), f.GetData())
	}
	return e
}

// withoutFileData is ev, or a copy without its file's data.
func withoutFileData(ev *covenpb.MessageResponse) *covenpb.MessageResponse {
	f := ev.GetFile()
	if f == nil || len(f.GetData()) == 0 {
		return ev
	}
	c := proto.Clone(ev).(*covenpb.MessageResponse)
	c.GetFile().Data = nil
	return c
}

// Append records one event of the answer that does not end it, and
// returns its entry. It is written with the next batch: once FlushBytes
// wait, Append writes them. more says that another event follows at once:
// subscribers are woken with that one, so that a burst of events wakes
// them once, not per event.
func (r *Recording) Append(ctx context.Context, ev *covenpb.MessageResponse, more bool) (*gatewayv1.ThreadEntry, error) {
	e := eventEntry(ev, r.s.now())
	size := r.record(e)
	r.mu.Lock()
	r.push(e, size)
	if !more {
		r.signal()
	}
	r.mu.Unlock()
	if len(r.pending) >= r.s.opts.FlushBytes {
		return e, r.Flush(ctx)
	}
	return e, nil
}

// Flush writes the entries that wait in memory, in one item (or a few,
// past dataCap).
func (r *Recording) Flush(ctx context.Context) error {
	if r.pendingN == 0 {
		return nil
	}
	first := r.flushedTo // written by the recorder only
	items, err := r.items(first, r.pending, r.s.now())
	if err != nil {
		return err
	}
	if err := r.s.write(ctx, items); err != nil {
		return err
	}
	n := r.pendingN
	r.pending, r.pendingN, r.stored = nil, 0, true
	r.mu.Lock()
	r.flushedTo = first + n
	r.trim()
	if first == 0 {
		// The message is stored: subscribers may be shown what waited.
		r.signal()
	}
	r.mu.Unlock()
	return nil
}

// Stored reports whether the client's message is stored: before, the
// request's own client is shown nothing of it either.
func (r *Recording) Stored() bool { return r.stored }

// SetAttached says whether the recorder relays the answer to its own
// client, which so follows the request without a subscription.
func (r *Recording) SetAttached(attached bool) {
	r.mu.Lock()
	r.attached = attached
	r.mu.Unlock()
}

// End records how the request ended: the agent's terminal event, when it
// sent one, and the outcome, and returns their entries. They are written
// with everything still waiting (the client's message too, for a short
// answer), retried until ctx ends, and shown to subscribers only once
// stored: a client told the request ended can read it back, on any
// replica. When they cannot be stored, subscribers get the error instead.
func (r *Recording) End(ctx context.Context, terminal *covenpb.MessageResponse, outcome *gatewayv1.Outcome) ([]*gatewayv1.ThreadEntry, error) {
	defer r.s.forget(r)
	now := r.s.now()
	var last []windowEntry
	if terminal != nil {
		e := eventEntry(terminal, now)
		last = append(make([]windowEntry, 0, 2), windowEntry{e, r.record(e)})
	}
	o := &gatewayv1.ThreadEntry{Time: timestamppb.New(now), Entry: &gatewayv1.ThreadEntry_Outcome{Outcome: outcome}}
	last = append(last, windowEntry{o, r.record(o)})
	err := r.flushRetrying(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	r.signal()
	if err != nil {
		r.endErr = err
		return nil, err
	}
	entries := make([]*gatewayv1.ThreadEntry, len(last))
	for i, w := range last {
		r.push(w.e, w.size)
		entries[i] = w.e
	}
	return entries, nil
}

// flushRetrying flushes, retrying with backoff until ctx ends.
func (r *Recording) flushRetrying(ctx context.Context) error {
	wait := 50 * time.Millisecond
	for {
		err := r.Flush(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// Discard forgets the recording of a request that was never sent: none of
// it was written.
func (r *Recording) Discard() { r.s.forget(r) }

// items packs the encoded entries in buf, the first with sequence number
// first, into items of at most dataCap bytes, each a part of buf; an
// entry larger than that takes items of its own (a head and continuation
// parts).
func (r *Recording) items(first uint32, buf []byte, now time.Time) ([]store.Item, error) {
	item := func(seq uint32, data []byte) store.Item {
		return store.Item{
			Key:       store.Key{PK: threadPK(r.threadID), SK: entrySK(entryKey{ms: r.ms, requestID: r.requestID, seq: seq})},
			Data:      data,
			Attrs:     map[string]string{"client": r.owner, "agent": r.agentID},
			ExpiresAt: r.s.expiry(now),
		}
	}
	if len(buf) <= dataCap {
		return []store.Item{item(first, buf)}, nil
	}
	var items []store.Item
	start, startSeq := 0, first // the entries of the next item: buf[start:off]
	for off, seq := 0, first; off < len(buf); seq++ {
		n, w := binary.Uvarint(buf[off:])
		if w <= 0 || n > uint64(len(buf)-off-w) {
			return nil, errors.New("history: corrupt pending entries")
		}
		end := off + w + int(n)
		switch {
		case end-off > dataCap:
			if off > start {
				items = append(items, item(startSeq, buf[start:off]))
			}
			parts := (end - off + dataCap - 1) / dataCap
			if parts > maxParts {
				return nil, fmt.Errorf("history: an entry of %d bytes is larger than the history keeps", end-off)
			}
			head := item(seq, buf[off:off+dataCap])
			head.Attrs["parts"] = strconv.Itoa(parts)
			items = append(items, head)
			for p := 1; p < parts; p++ {
				part := item(seq, buf[off+p*dataCap:min(off+(p+1)*dataCap, end)])
				part.SK = partSK(head.SK, p)
				items = append(items, part)
			}
			start, startSeq = end, seq+1
		case end-start > dataCap:
			items = append(items, item(startSeq, buf[start:off]))
			start, startSeq = off, seq
		}
		off = end
	}
	if start < len(buf) {
		items = append(items, item(startSeq, buf[start:]))
	}
	return items, nil
}

// write stores items, one after another.
func (s *Store) write(ctx context.Context, items []store.Item) error {
	start := time.Now()
	var err error
	for _, it := range items {
		if err = s.create(ctx, it); err != nil {
			break
		}
	}
	if s.opts.Observe != nil {
		s.opts.Observe(len(items), time.Since(start), err)
	}
	if err != nil {
		return fmt.Errorf("history: writing entries: %w", err)
	}
	return nil
}

// signal wakes every subscriber; r.mu is held.
func (r *Recording) signal() {
	for sub := range r.subs {
		select {
		case sub.signal <- struct{}{}:
		default:
		}
	}
}

// trim drops from memory the stored entries every subscriber has read, and
// past maxWindowBytes every stored one; r.mu is held.
func (r *Recording) trim() {
	upTo := r.flushedTo
	if r.windowBytes <= maxWindowBytes {
		for sub := range r.subs {
			upTo = min(upTo, sub.next)
		}
	}
	for r.windowStart < upTo && len(r.window) > 0 {
		r.windowBytes -= r.window[0].size
		r.window[0] = windowEntry{}
		r.window = r.window[1:]
		r.windowStart++
	}
}

// push adds an entry of size bytes to the window; r.mu is held.
func (r *Recording) push(e *gatewayv1.ThreadEntry, size int) {
	r.window = append(r.window, windowEntry{e, size})
	r.windowBytes += size
}

// Subscription reads a recording's entries in order.
type Subscription struct {
	r      *Recording
	next   uint32 // guarded by r.mu
	signal chan struct{}
}

// Subscribe reads the entries with sequence numbers from from on.
func (r *Recording) Subscribe(from uint32) *Subscription {
	sub := &Subscription{r: r, next: from, signal: make(chan struct{}, 1)}
	r.mu.Lock()
	if r.subs == nil {
		r.subs = map[*Subscription]struct{}{}
	}
	r.subs[sub] = struct{}{}
	r.mu.Unlock()
	return sub
}

// Followers is how many clients follow the request: its subscriptions,
// and the recorder's own client while it is attached.
func (r *Recording) Followers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.subs)
	if r.attached {
		n++
	}
	return n
}

// Pending is how many bytes of entries wait to be written.
func (r *Recording) Pending() int { return len(r.pending) }

// Close ends the subscription.
func (sub *Subscription) Close() {
	r := sub.r
	r.mu.Lock()
	delete(r.subs, sub)
	r.trim()
	r.mu.Unlock()
}

// ErrLost is a subscriber's error when entries it had not read are
// neither in memory nor in the store.
var ErrLost = errors.New("history: entries of the request are missing from the store")

// Next returns the entries after those it returned before, waiting for
// some, and for the client's message to be stored; io.EOF once the
// request ended and all were returned, or the error the recording ended
// with when its end could not be stored.
func (sub *Subscription) Next(ctx context.Context) ([]*gatewayv1.ThreadEntry, error) {
	r := sub.r
	for {
		r.mu.Lock()
		from, end := sub.next, r.windowStart+uint32(len(r.window))
		if r.flushedTo == 0 {
			end = from // nothing is shown before the message is stored
		}
		switch {
		case from < r.windowStart:
			// Stored, and no longer in memory.
			upTo := r.windowStart
			r.mu.Unlock()
			entries, _, err := r.s.RequestEntries(ctx, r.threadID, r.Message(), from, int(upTo-from))
			if err != nil {
				return nil, err
			}
			if len(entries) == 0 {
				return nil, ErrLost
			}
			last, _, err := Seq(entries[len(entries)-1].GetEntryId())
			if err != nil {
				return nil, err
			}
			r.mu.Lock()
			sub.next = last + 1
			r.trim()
			r.mu.Unlock()
			return entries, nil
		case from < end:
			out := make([]*gatewayv1.ThreadEntry, 0, end-from)
			for _, w := range r.window[from-r.windowStart:] {
				out = append(out, w.e)
			}
			sub.next = end
			r.trim()
			r.mu.Unlock()
			return out, nil
		case r.ended:
			err := r.endErr
			r.mu.Unlock()
			if err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		r.mu.Unlock()
		select {
		case <-sub.signal:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
