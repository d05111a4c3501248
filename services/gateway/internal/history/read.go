package history

import (
	"context"
	"fmt"
	"strconv"

	"github.com/conclave-ai/conclave/pkg/store"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// Entries returns up to limit entries of threadID, oldest first: from the
// start, or after the entry after. more reports that entries may follow.
func (s *Store) Entries(ctx context.Context, threadID, after string, limit int) (entries []*gatewayv1.ThreadEntry, more bool, err error) {
	pk := threadPK(threadID)
	from := entryPrefix
	keep := func(entryKey, string) bool { return true }
	if after != "" {
		if _, err := parseEntryID(after); err != nil {
			return nil, false, fmt.Errorf("%w: after %v", ErrBadCursor, err)
		}
		if from, err = s.headAtOrBefore(ctx, pk, entryPrefix, entryPrefix+after); err != nil {
			return nil, false, err
		}
		keep = func(_ entryKey, id string) bool { return id > after }
	}
	return s.scan(ctx, threadID, from, entriesEnd, keep, limit)
}

// RequestEntries returns up to limit entries of one request of threadID,
// the one whose client message is msg, with sequence numbers from from on.
func (s *Store) RequestEntries(ctx context.Context, threadID string, msg EntryRef, from uint32, limit int) ([]*gatewayv1.ThreadEntry, bool, error) {
	pk := threadPK(threadID)
	prefix := entryPrefix + requestPrefix(msg.k.ms, msg.k.requestID)
	start, err := s.headAtOrBefore(ctx, pk, prefix, entryPrefix+entryKey{ms: msg.k.ms, requestID: msg.k.requestID, seq: from}.String())
	if err != nil {
		return nil, false, err
	}
	keep := func(k entryKey, _ string) bool {
		return k.requestID == msg.k.requestID && k.ms == msg.k.ms && k.seq >= from
	}
	return s.scan(ctx, threadID, start, prefix+requestEnd, keep, limit)
}

// EntryRef names a request's client message entry: the request's place in
// its thread.
type EntryRef struct{ k entryKey }

// ParseEntryRef parses an entry id as a request's reference.
func ParseEntryRef(id string) (EntryRef, error) {
	k, err := parseEntryID(id)
	if err != nil {
		return EntryRef{}, fmt.Errorf("%w: %v", ErrBadCursor, err)
	}
	k.seq = 0
	return EntryRef{k: k}, nil
}

// RequestID is the request the reference names.
func (r EntryRef) RequestID() string { return r.k.requestID }

// Seq is an entry's sequence number in its request, from its entry id.
func Seq(entryID string) (uint32, string, error) {
	k, err := parseEntryID(entryID)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %v", ErrBadCursor, err)
	}
	return k.seq, k.requestID, nil
}

func (r EntryRef) String() string { return r.k.String() }

// EntryID is the id of the entry seq of the request ref names.
func EntryID(ref EntryRef, seq uint32) string {
	k := ref.k
	k.seq = seq
	return k.String()
}

// headAtOrBefore is the sort key to scan from so as to meet the entry at
// sk: the head of the last item at or before it within [lowest, sk], or sk
// itself when there is none.
func (s *Store) headAtOrBefore(ctx context.Context, pk, lowest, sk string) (string, error) {
	page, err := s.st.Query(ctx, Table.Name, store.Query{PK: pk, From: lowest, To: sk, Reverse: true, Limit: 1})
	if err != nil {
		return "", err
	}
	if len(page.Items) == 0 {
		return sk, nil
	}
	head := page.Items[0].SK
	if k, part, err := itemKey(head); err == nil && part > 0 {
		head = entryPrefix + k.String()
	}
	return head, nil
}

// partial is an entry whose parts are being read.
type partial struct {
	head  entryKey
	n     int
	got   int
	data  []byte
	attrs map[string]string
}

// scanPage is how many items one query of a scan asks for.
const scanPage = 100

// scan reads the entries of the items in [from, to] of threadID's
// partition, in order, keeping those keep accepts, until limit are kept.
func (s *Store) scan(ctx context.Context, threadID, from, to string, keep func(k entryKey, id string) bool, limit int) ([]*gatewayv1.ThreadEntry, bool, error) {
	q := store.Query{PK: threadPK(threadID), From: from, To: to, Limit: min(limit+1, scanPage)}
	var out []*gatewayv1.ThreadEntry
	var asm *partial
	for {
		page, err := s.st.Query(ctx, Table.Name, q)
		if err != nil {
			return nil, false, err
		}
		for _, it := range page.Items {
			k, part, err := itemKey(it.SK)
			if err != nil {
				continue // not an entry: nothing else is stored in the range
			}
			var data []byte
			switch {
			case part > 0:
				if asm == nil || asm.head != k || part != asm.got {
					asm = nil
					continue // a part whose head is not in this scan
				}
				asm.data = append(asm.data, it.Data...)
				if asm.got++; asm.got < asm.n {
					continue
				}
				data, it.Attrs, asm = asm.data, asm.attrs, nil
			case it.Attrs["parts"] != "":
				n, err := strconv.Atoi(it.Attrs["parts"])
				if err != nil || n < 2 || n > maxParts {
					return nil, false, fmt.Errorf("history: item %s of thread %q: bad parts %q", it.SK, threadID, it.Attrs["parts"])
				}
				asm = &partial{head: k, n: n, got: 1, data: append([]byte(nil), it.Data...), attrs: it.Attrs}
				continue
			default:
				data = it.Data
			}
			entries, err := decodeEntries(data)
			if err != nil {
				return nil, false, fmt.Errorf("%w: item %s of thread %q", err, it.SK, threadID)
			}
			for i, e := range entries {
				ek := entryKey{ms: k.ms, requestID: k.requestID, seq: k.seq + uint32(i)}
				id := ek.String()
				if !keep(ek, id) {
					continue
				}
				if len(out) == limit {
					return out, true, nil
				}
				e.EntryId, e.ThreadId, e.RequestId, e.AgentId = id, threadID, ek.requestID, it.Attrs["agent"]
				out = append(out, e)
			}
		}
		if page.Cursor == "" {
			return out, false, nil
		}
		q.Cursor = page.Cursor
	}
}
