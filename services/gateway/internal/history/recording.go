package history

import (
	"context"
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
// Append, Flush and End are called by one goroutine, the request's
// recorder; subscribers call Subscribe and their Subscription's methods.
type Recording struct {
	s                                   *Store
	threadID, requestID, agentID, owner string
	ms                                  int64

	// pending and pendingBytes are the recorder's own.
	pending      [][]byte // encoded entries from seq flushedTo on
	pendingBytes int

	mu          sync.Mutex
	next        uint32 // seq of the next entry
	flushedTo   uint32 // entries before it are stored
	window      []*gatewayv1.ThreadEntry
	windowSizes []int  // memSize of each entry of window
	windowStart uint32 // seq of window[0]
	windowBytes int
	subs        map[*Subscription]struct{}
	ended       bool
	endErr      error
}

// Begin records ex's client message, before the request is sent to the
// agent, and returns the recording of the answer. The message is stored
// when Begin returns.
func (s *Store) Begin(ctx context.Context, ex Exchange) (*Recording, error) {
	now := ex.Start
	if now.IsZero() {
		now = s.now()
	}
	r := &Recording{s: s, threadID: ex.ThreadID, requestID: ex.RequestID, agentID: ex.AgentID, owner: ex.ClientID,
		ms: now.UnixMilli(), subs: map[*Subscription]struct{}{}}
	msg := r.entry(0, now)
	msg.Entry = &gatewayv1.ThreadEntry_Message{Message: &gatewayv1.ClientMessage{
		Sender: ex.Sender, Content: ex.Content, Attachments: AttachmentRefs(ex.Attachments), ClientId: ex.ClientID,
	}}
	enc := appendEntry(nil, msg)
	items, err := r.items(0, [][]byte{enc}, now)
	if err != nil {
		return nil, err
	}
	if err := s.write(ctx, items); err != nil {
		return nil, err
	}
	r.next, r.flushedTo = 1, 1
	size := memSize(msg, enc)
	r.window, r.windowSizes, r.windowBytes = []*gatewayv1.ThreadEntry{msg}, []int{size}, size
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

func (r *Recording) entry(seq uint32, at time.Time) *gatewayv1.ThreadEntry {
	return &gatewayv1.ThreadEntry{
		EntryId: entryKey{ms: r.ms, requestID: r.requestID, seq: seq}.String(), ThreadId: r.threadID,
		RequestId: r.requestID, AgentId: r.agentID, Time: timestamppb.New(at),
	}
}

// eventEntry is ev as an entry: whole, for subscribers (the store keeps a
// file without its data, see appendEntry).
func (r *Recording) eventEntry(seq uint32, ev *covenpb.MessageResponse, at time.Time) *gatewayv1.ThreadEntry {
	e := r.entry(seq, at)
	e.Entry = &gatewayv1.ThreadEntry_Event{Event: ev}
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

// Append records one event of the answer that does not end it. It is
// written with the next batch: once FlushBytes wait, Append writes them.
// more says that another event follows at once: subscribers are woken
// with that one, so that a burst of events wakes them once, not per event.
func (r *Recording) Append(ctx context.Context, ev *covenpb.MessageResponse, more bool) error {
	// The recorder is the only writer of r.next: it may read it unlocked,
	// and build and encode the entry before taking the lock.
	e := r.eventEntry(r.next, ev, r.s.now())
	enc := appendEntry(nil, e)
	r.mu.Lock()
	r.next++
	r.push(e, memSize(e, enc))
	if !more {
		r.signal()
	}
	r.mu.Unlock()
	r.pending = append(r.pending, enc)
	r.pendingBytes += len(enc)
	if r.pendingBytes >= r.s.opts.FlushBytes {
		return r.Flush(ctx)
	}
	return nil
}

// Flush writes the entries that wait in memory, in one item (or a few,
// past dataCap).
func (r *Recording) Flush(ctx context.Context) error {
	if len(r.pending) == 0 {
		return nil
	}
	r.mu.Lock()
	first := r.flushedTo
	r.mu.Unlock()
	items, err := r.items(first, r.pending, r.s.now())
	if err != nil {
		return err
	}
	if err := r.s.write(ctx, items); err != nil {
		return err
	}
	n := uint32(len(r.pending))
	r.pending, r.pendingBytes = nil, 0
	r.mu.Lock()
	r.flushedTo = first + n
	r.trim()
	r.mu.Unlock()
	return nil
}

// End records how the request ended: the agent's terminal event, when it
// sent one, and the outcome. They are written with everything still
// waiting, retried until ctx ends, and shown to subscribers only once
// stored: a client told the request ended can read it back, on any
// replica. When they cannot be stored, subscribers get the error instead.
func (r *Recording) End(ctx context.Context, terminal *covenpb.MessageResponse, outcome *gatewayv1.Outcome) error {
	defer r.s.forget(r)
	now := r.s.now()
	r.mu.Lock()
	var last []*gatewayv1.ThreadEntry
	if terminal != nil {
		last = append(last, r.eventEntry(r.next, terminal, now))
		r.next++
	}
	o := r.entry(r.next, now)
	o.Entry = &gatewayv1.ThreadEntry_Outcome{Outcome: outcome}
	last = append(last, o)
	r.next++
	r.mu.Unlock()
	encs := make([][]byte, len(last))
	for i, e := range last {
		encs[i] = appendEntry(nil, e)
		r.pending = append(r.pending, encs[i])
		r.pendingBytes += len(encs[i])
	}
	err := r.flushRetrying(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		for i, e := range last {
			r.push(e, memSize(e, encs[i]))
		}
	} else {
		r.endErr = err
	}
	r.ended = true
	r.signal()
	return err
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

// Discard removes the client message of a request that was never sent,
// best effort, and forgets the recording.
func (r *Recording) Discard(ctx context.Context) error {
	r.s.forget(r)
	return r.s.st.Delete(ctx, Table.Name, store.Key{PK: threadPK(r.threadID), SK: entryPrefix + r.Message().String()})
}

// items packs encoded entries, the first with sequence number first, into
// items of at most dataCap bytes; an entry larger than that takes items of
// its own (a head and continuation parts).
func (r *Recording) items(first uint32, encoded [][]byte, now time.Time) ([]store.Item, error) {
	var items []store.Item
	item := func(seq uint32, data []byte) store.Item {
		return store.Item{
			Key:       store.Key{PK: threadPK(r.threadID), SK: entryPrefix + entryKey{ms: r.ms, requestID: r.requestID, seq: seq}.String()},
			Data:      data,
			Attrs:     map[string]string{"client": r.owner, "agent": r.agentID},
			ExpiresAt: r.s.expiry(now),
		}
	}
	var cur []byte
	var curFirst uint32
	closeCur := func() {
		if len(cur) > 0 {
			items = append(items, item(curFirst, cur))
			cur = nil
		}
	}
	for i, enc := range encoded {
		seq := first + uint32(i)
		if len(enc) > dataCap {
			closeCur()
			n := (len(enc) + dataCap - 1) / dataCap
			if n > maxParts {
				return nil, fmt.Errorf("history: an entry of %d bytes is larger than the history keeps", len(enc))
			}
			head := item(seq, enc[:dataCap])
			head.Attrs["parts"] = strconv.Itoa(n)
			items = append(items, head)
			for p := 1; p < n; p++ {
				part := item(seq, enc[p*dataCap:min((p+1)*dataCap, len(enc))])
				part.SK = partSK(head.SK, p)
				items = append(items, part)
			}
			continue
		}
		if len(cur)+len(enc) > dataCap {
			closeCur()
		}
		if len(cur) == 0 {
			curFirst = seq
		}
		cur = append(cur, enc...)
	}
	closeCur()
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
		r.windowBytes -= r.windowSizes[0]
		r.window[0] = nil
		r.window, r.windowSizes = r.window[1:], r.windowSizes[1:]
		r.windowStart++
	}
}

// push adds an entry of size bytes to the window; r.mu is held.
func (r *Recording) push(e *gatewayv1.ThreadEntry, size int) {
	r.window = append(r.window, e)
	r.windowSizes = append(r.windowSizes, size)
	r.windowBytes += size
}

// memSize is about what e holds in memory: its encoding enc, and an
// event's file data, which enc leaves out.
func memSize(e *gatewayv1.ThreadEntry, enc []byte) int {
	return len(enc) + len(e.GetEvent().GetFile().GetData())
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
	r.subs[sub] = struct{}{}
	r.mu.Unlock()
	return sub
}

// Subscribers is how many subscriptions are open.
func (r *Recording) Subscribers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.subs)
}

// Pending is how many bytes of entries wait to be written.
func (r *Recording) Pending() int { return r.pendingBytes }

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
// some; io.EOF once the request ended and all were returned, or the error
// the recording ended with when its end could not be stored.
func (sub *Subscription) Next(ctx context.Context) ([]*gatewayv1.ThreadEntry, error) {
	r := sub.r
	for {
		r.mu.Lock()
		from, end := sub.next, r.windowStart+uint32(len(r.window))
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
			out := append([]*gatewayv1.ThreadEntry(nil), r.window[from-r.windowStart:]...)
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
