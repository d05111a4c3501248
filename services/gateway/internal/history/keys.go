package history

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// The table's layout. Every item is in one of two partitions:
//
//	t/<thread_id>  meta                          the thread: its owner, first agent, start
//	               agent/<agent_id>              another agent the thread reached
//	               e/<entry_id>                  entries, oldest first (one or a batch)
//	               e/<entry_id>~<nn>             continuation parts of an entry too large for one item
//	a/<agent_id>   <start ms>/<thread_id>        the agent's threads, by when each reached it
//
// An entry_id is "<13-digit unix ms>.<request_id>/<8 hex digits>": the
// request's start, the request, and the entry's sequence number in it (0
// for the client's message, then the agent's events, then the outcome).
// So a thread's entries sort by request, then in order within a request,
// and a string comparison of entry ids is their order.
const (
	threadPrefix = "t/"
	agentPrefix  = "a/"
	metaSK       = "meta"
	markerPrefix = "agent/"
	entryPrefix  = "e/"
	// entriesEnd sorts after every entry's sort key ('0' follows '/').
	entriesEnd = "e0"
	partMark   = '~'
	// requestEnd, appended to a request's prefix, sorts after every one
	// of its entries' sort keys (hex digits and parts).
	requestEnd = "~~"
)

func threadPK(threadID string) string { return threadPrefix + threadID }
func agentPK(agentID string) string   { return agentPrefix + agentID }

// entryKey is an entry's position: its request and sequence number.
type entryKey struct {
	ms        int64
	requestID string
	seq       uint32
}

// String is the entry id. It is made for every event a gateway relays
// with history on, so it is built in one allocation (the string's), on
// the stack, without fmt.
func (k entryKey) String() string {
	var buf [96]byte
	return string(k.appendTo(buf[:0]))
}

// appendTo appends the entry id.
func (k entryKey) appendTo(b []byte) []byte {
	return appendSeq(appendRequestPrefix(b, k.ms, k.requestID), k.seq)
}

// entrySK is the sort key of the item whose (first) entry is at k.
func entrySK(k entryKey) string {
	var buf [96]byte
	return string(k.appendTo(append(buf[:0], entryPrefix...)))
}

func requestPrefix(ms int64, requestID string) string {
	var buf [96]byte
	return string(appendRequestPrefix(buf[:0], ms, requestID))
}

// appendRequestPrefix appends "<13-digit ms>.<request_id>/".
func appendRequestPrefix(b []byte, ms int64, requestID string) []byte {
	b = appendZeroPadded(b, ms, 13)
	b = append(b, '.')
	b = append(b, requestID...)
	return append(b, '/')
}

// appendSeq appends seq as 8 lowercase hex digits.
func appendSeq(b []byte, seq uint32) []byte {
	const hex = "0123456789abcdef"
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, hex[seq>>uint(shift)&0xf])
	}
	return b
}

// appendZeroPadded appends n (not negative) in decimal, padded with zeros
// to width digits, as fmt's %0<width>d does.
func appendZeroPadded(b []byte, n int64, width int) []byte {
	var digits [20]byte
	d := strconv.AppendInt(digits[:0], n, 10)
	for i := len(d); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, d...)
}

// MaxEntryIDBytes bounds an entry id a client sends back.
const MaxEntryIDBytes = 13 + 1 + ids.MaxBytes + 1 + 8

// errEntryID is a malformed entry id.
var errEntryID = errors.New("is not an entry_id this gateway issued")

// parseEntryID parses an entry id that came from a client, trusting
// nothing about it.
func parseEntryID(s string) (entryKey, error) {
	n := len(s)
	if n < 13+1+1+1+8 || n > MaxEntryIDBytes || s[13] != '.' || s[n-9] != '/' {
		return entryKey{}, errEntryID
	}
	ms, err := strconv.ParseInt(s[:13], 10, 64)
	if err != nil || ms < 0 {
		return entryKey{}, errEntryID
	}
	seq, err := strconv.ParseUint(s[n-8:], 16, 32)
	if err != nil || strings.ToLower(s[n-8:]) != s[n-8:] {
		return entryKey{}, errEntryID
	}
	req := s[14 : n-9]
	if ids.RequestID.Check(req) != nil {
		return entryKey{}, errEntryID
	}
	return entryKey{ms: ms, requestID: req, seq: uint32(seq)}, nil
}

// itemKey parses an entry item's sort key: the entry id of its first (or
// only) entry, and its part number (0 for the head).
func itemKey(sk string) (entryKey, int, error) {
	id, ok := strings.CutPrefix(sk, entryPrefix)
	if !ok {
		return entryKey{}, 0, errEntryID
	}
	part := 0
	if i := strings.LastIndexByte(id, partMark); i > 0 && i == len(id)-3 {
		p, err := strconv.ParseUint(id[i+1:], 16, 8)
		if err != nil || p == 0 {
			return entryKey{}, 0, errEntryID
		}
		id, part = id[:i], int(p)
	}
	k, err := parseEntryID(id)
	return k, part, err
}

func partSK(head string, part int) string { return fmt.Sprintf("%s%c%02x", head, partMark, part) }

// maxParts bounds how many items one entry may take: 16 parts of dataCap
// hold an event far larger than gRPC's 4 MiB message limit lets through.
const maxParts = 16

// indexSK is an agent-index item's sort key.
func indexSK(startMs int64, threadID string) string {
	b := appendZeroPadded(make([]byte, 0, 14+len(threadID)), startMs, 13)
	return string(append(append(b, '/'), threadID...))
}

// parseIndexSK parses what indexSK writes, and only that: 13 digits, so
// that a key it accepts is the one indexSK would make.
func parseIndexSK(sk string) (int64, string, bool) {
	if len(sk) < 15 || sk[13] != '/' || strings.Trim(sk[:13], "0123456789") != "" {
		return 0, "", false
	}
	ms, err := strconv.ParseInt(sk[:13], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return ms, sk[14:], true
}

// appendEntry appends one stored entry: its length, then the ThreadEntry
// as e holds it, which is only what the key does not say (time, payload,
// file: its ids are set once it is encoded). It sizes the entry once and
// marshals it in place. An event's file is stored without its data.
func appendEntry(b []byte, e *gatewayv1.ThreadEntry) []byte {
	if ev := e.GetEvent(); len(ev.GetFile().GetData()) > 0 {
		e = &gatewayv1.ThreadEntry{Time: e.GetTime(), File: e.GetFile(), Entry: &gatewayv1.ThreadEntry_Event{Event: withoutFileData(ev)}}
	}
	n := proto.Size(e)
	b = binary.AppendUvarint(slices.Grow(b, binary.MaxVarintLen32+n), uint64(n))
	b, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, e)
	return b
}

// decodeEntries parses an item's data, written by appendEntry, from a
// file that may be damaged: every length is checked.
func decodeEntries(b []byte) ([]*gatewayv1.ThreadEntry, error) {
	var out []*gatewayv1.ThreadEntry
	for len(b) > 0 {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return nil, errors.New("history: corrupt entry")
		}
		e := &gatewayv1.ThreadEntry{}
		if err := proto.Unmarshal(b[w:w+int(n)], e); err != nil {
			return nil, fmt.Errorf("history: corrupt entry: %w", err)
		}
		out = append(out, e)
		b = b[w+int(n):]
	}
	return out, nil
}
