package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/jsonscan"
)

// Reasons a line from an agent is dropped instead of reaching the JSON-RPC
// connection; each is logged and counted.
const (
	DropTooLong = "line_too_long"
	DropNotUTF8 = "not_utf8"
	DropNotJSON = "not_json"
	DropEarly   = "before_initialize"
	// DropReplay: an update replaying history during session/load, which
	// is not published again.
	DropReplay      = "session_load_replay"
	DropBadUpdate   = "bad_update"
	DropUnknownType = "unknown_legacy_type"
	// DropUnknownResponse: a response whose id is none of our requests.
	DropUnknownResponse = "unknown_response"
)

// lineFilter is the jsonrpc.Stream over an agent's stdio. It reads lines
// itself, rather than through jsonrpc.NewLineStream, because an agent's
// stdout is not trusted to be only JSON-RPC: an oversized line is skipped
// (the next newline is still a frame boundary on a pipe), and lines that are
// not UTF-8, not JSON, or Kandev's legacy format are taken out before the
// connection sees them, in order with the JSON-RPC frames around them.
type lineFilter struct {
	r      *bufio.Reader
	rc     io.Closer
	w      io.WriteCloser
	max    int
	legacy func(line []byte)
	drop   func(reason string, line []byte)

	wmu sync.Mutex

	// sent holds the ids of our requests not yet answered, as their JSON
	// text, so that a response to anything else is dropped and counted here
	// rather than reaching the connection.
	idMu sync.Mutex
	sent map[string]struct{}
}

func newLineFilter(r io.Reader, w io.WriteCloser, maxLine int, legacy func([]byte), drop func(string, []byte)) *lineFilter {
	f := &lineFilter{r: bufio.NewReaderSize(r, 64<<10), w: w, max: maxLine, legacy: legacy, drop: drop, sent: map[string]struct{}{}}
	f.rc, _ = r.(io.Closer)
	return f
}

var _ jsonrpc.Stream = (*lineFilter)(nil)

func (f *lineFilter) ReadMessage(context.Context) ([]byte, error) {
	for {
		line, tooLong, err := f.readLine()
		if err != nil {
			return nil, err
		}
		if tooLong {
			f.drop(DropTooLong, nil)
			continue
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		kind, members := classify(line)
		switch kind {
		case lineNotUTF8:
			f.drop(DropNotUTF8, line)
			continue
		case lineNotJSON:
			f.drop(DropNotJSON, line)
			continue
		case lineLegacy:
			f.legacy(line)
			continue
		}
		if members.isResponse() && !f.expected(string(members.id)) {
			f.drop(DropUnknownResponse, line)
			continue
		}
		return line, nil
	}
}

// expected reports whether a response, by its id's JSON text, answers one
// of our requests, and forgets the request.
func (f *lineFilter) expected(id string) bool {
	f.idMu.Lock()
	defer f.idMu.Unlock()
	if _, ok := f.sent[id]; ok {
		delete(f.sent, id)
		return true
	}
	// A null id answers a request the peer could not read: the
	// connection reports it.
	return id == "null" || id == ""
}

type lineKind int

const (
	lineJSONRPC lineKind = iota
	lineNotUTF8
	lineNotJSON
	lineLegacy
)

// topLevel is what the line filter needs of a line's top-level members,
// read by their exact names as pkg/jsonrpc reads them: a member of that name
// nested anywhere else, or the text inside a string, does not count.
type topLevel struct {
	jsonrpc, method, resultOrError bool
	// id is the id member's JSON text, nil without one.
	id []byte
}

// isResponse: a JSON-RPC response, which must answer one of our requests.
// A message with neither a method nor a result is left to the connection,
// which answers it as an Invalid Request.
func (t topLevel) isResponse() bool { return t.jsonrpc && !t.method && t.resultOrError }

// readTopLevel walks the members of the object b. With untilMethod it stops
// once b is known to be a JSON-RPC request or notification, which for a
// notification (the stream's bulk, sent "jsonrpc" and "method" first by
// every SDK) is after two members rather than the whole line.
func readTopLevel(b []byte, untilMethod bool) (topLevel, error) {
	var t topLevel
	err := jsonscan.EachMember(b, func(k, v []byte) bool {
		switch string(k) {
		case "jsonrpc":
			t.jsonrpc = true
		case "method":
			t.method = true
		case "id":
			t.id = v
		case "result", "error":
			t.resultOrError = true
		}
		return !(untilMethod && t.jsonrpc && t.method)
	})
	return t, err
}

// classify sorts a line by its top-level members: an object with a
// "jsonrpc" member is JSON-RPC, any other JSON object Kandev's legacy
// format (whatever its data contains), a batch JSON-RPC. The JSON-RPC path
// costs a UTF-8 scan and a walk over the first members; full validation is
// the connection's, which answers malformed JSON with ParseError.
func classify(line []byte) (lineKind, topLevel) {
	if !utf8.Valid(line) {
		return lineNotUTF8, topLevel{}
	}
	switch line[0] {
	case '[':
		return lineJSONRPC, topLevel{}
	case '{':
	default:
		return lineNotJSON, topLevel{}
	}
	t, err := readTopLevel(line, true)
	switch {
	case t.jsonrpc:
		// Even when malformed further on: the connection answers it.
		return lineJSONRPC, t
	case err != nil || !json.Valid(line):
		return lineNotJSON, t
	}
	return lineLegacy, t
}

// readLine returns the next line, or tooLong once it has skipped a line
// over the limit.
func (f *lineFilter) readLine() (line []byte, tooLong bool, err error) {
	var long []byte
	for {
		chunk, err := f.r.ReadSlice('\n')
		switch {
		case err == nil:
			if tooLong {
				return nil, true, nil
			}
			chunk = chunk[:len(chunk)-1]
			if len(long)+len(chunk) > f.max {
				return nil, true, nil
			}
			if long == nil {
				return bytes.Clone(chunk), false, nil
			}
			return append(long, chunk...), false, nil
		case errors.Is(err, bufio.ErrBufferFull):
			if !tooLong && len(long)+len(chunk) > f.max {
				tooLong, long = true, nil
			}
			if !tooLong {
				long = append(long, chunk...)
			}
		case errors.Is(err, io.EOF) && (len(chunk) > 0 || len(long) > 0) && !tooLong:
			// A last line without a newline is still a line.
			if len(long)+len(chunk) > f.max {
				return nil, true, nil
			}
			return append(long, chunk...), false, nil
		default:
			return nil, false, err
		}
	}
}

func (f *lineFilter) WriteMessage(_ context.Context, data []byte) error {
	if len(data) > 0 && data[0] == '{' {
		if t, err := readTopLevel(data, false); err == nil && t.method && t.id != nil {
			f.idMu.Lock()
			f.sent[string(t.id)] = struct{}{}
			f.idMu.Unlock()
		}
	}
	f.wmu.Lock()
	defer f.wmu.Unlock()
	frame := make([]byte, 0, len(data)+1)
	if bytes.IndexByte(data, '\n') >= 0 {
		buf := bytes.NewBuffer(frame)
		if err := json.Compact(buf, data); err != nil {
			return err
		}
		frame = buf.Bytes()
	} else {
		frame = append(frame, data...)
	}
	_, err := f.w.Write(append(frame, '\n'))
	return err
}

func (f *lineFilter) Close() error {
	err := f.w.Close()
	if f.rc != nil {
		err = errors.Join(err, f.rc.Close())
	}
	return err
}
