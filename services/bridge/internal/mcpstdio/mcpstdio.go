// Package mcpstdio is the bridge's stdio MCP transport: the Go SDK's
// newline-delimited JSON transport, read through a filter that answers
// lines that are not JSON-RPC messages itself.
//
// The SDK's transport decodes stdin as one JSON stream and ends the session
// at the first line it cannot decode, since a stream decoder cannot find the
// next message after garbage. Lines can: each message is one line, so the
// filter checks every line on its own, passes the good ones on, answers a
// line that is not JSON with the JSON-RPC parse error (-32700) and a line
// that is JSON but not a JSON-RPC message with invalid request (-32600), and
// carries on with the next line, as JSON-RPC 2.0 asks of a server.
//
// The SDK also ends the session as soon as its reader reports the end of
// input, cancelling the requests in flight and dropping their answers. A
// client that writes its requests and closes stdin (`printf ... | conclave
// bridge mcp`) would get no answer at all. So the filter keeps the end of
// input from the SDK until every request it passed on has been answered:
// the end of input ends the session only after that, as a stdio server
// should.
package mcpstdio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxLineBytes is the longest line accepted, the SDK's own frame limit.
const MaxLineBytes = mcp.DefaultMaxLineLength

// NewTransport returns the transport for a session on in (the client's
// messages) and out (where only protocol frames may be written).
func NewTransport(in io.ReadCloser, out io.WriteCloser, logger *slog.Logger) *mcp.IOTransport {
	calls := newInFlight()
	w := &lockedWriter{w: out, calls: calls}
	return &mcp.IOTransport{
		Reader: &filter{in: bufio.NewReader(in), closer: in, out: w, calls: calls, logger: logger, maxLine: MaxLineBytes},
		Writer: w,
		// The filter enforces the frame limit, line by line, and answers
		// an overlong line instead of ending the session.
		MaxLineLength: -1,
	}
}

// lockedWriter serialises the filter's error responses with the SDK's
// writes: each is one whole line, and lines must not interleave. It tells
// calls what the SDK writes: the answers to the client's requests, and the
// server's own requests.
type lockedWriter struct {
	mu    sync.Mutex
	w     io.WriteCloser
	calls *inFlight
}

// Write writes one of the SDK's frames: the SDK writes each whole, in one
// call.
func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(p)
	if err != nil {
		// Nothing more can be answered: the client is gone.
		l.calls.end()
		return n, err
	}
	l.calls.written(decode(bytes.TrimSpace(p)))
	return n, nil
}

// writeAnswer writes one of the filter's own error responses, to a line
// the SDK never saw: it settles none of the requests the SDK owes answers
// to, even when it carries the id of one.
func (l *lockedWriter) writeAnswer(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.w.Write(p); err != nil {
		l.calls.end()
	}
}

func (l *lockedWriter) Close() error { return l.w.Close() }

// inFlight is what each side of the session still owes the other: the
// client's requests the SDK has not answered, and the server's requests
// the client has not answered.
type inFlight struct {
	mu     sync.Mutex
	owed   map[jsonrpc.ID]bool // the client's requests passed on to the SDK
	asked  map[jsonrpc.ID]bool // the server's requests written to the client
	ended  bool                // the SDK closed the session, or the client stopped reading
	change chan struct{}       // closed, and replaced, when any of the above changes
}

func newInFlight() *inFlight {
	return &inFlight{owed: map[jsonrpc.ID]bool{}, asked: map[jsonrpc.ID]bool{}, change: make(chan struct{})}
}

// changed wakes a reader waiting in drain; the caller holds mu.
func (f *inFlight) changed() {
	close(f.change)
	f.change = make(chan struct{})
}

// read records messages the filter passes on from the client.
func (f *inFlight) read(msgs []jsonrpc.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range msgs {
		switch m := m.(type) {
		case *jsonrpc.Request:
			if m.IsCall() {
				f.owed[m.ID] = true
			} else if id, ok := cancelled(m); ok {
				// MCP: a cancelled request needs no answer.
				delete(f.owed, id)
			}
		case *jsonrpc.Response:
			delete(f.asked, m.ID)
		}
	}
	f.changed()
}

// written records messages the SDK wrote to the client.
func (f *inFlight) written(msgs []jsonrpc.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range msgs {
		switch m := m.(type) {
		case *jsonrpc.Response:
			delete(f.owed, m.ID)
		case *jsonrpc.Request:
			if m.IsCall() {
				f.asked[m.ID] = true
			}
		}
	}
	f.changed()
}

// end stops any wait in drain: the session is over.
func (f *inFlight) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ended {
		f.ended = true
		f.changed()
	}
}

// drain is called once the client's input has ended. It waits until the
// SDK has answered every request the client sent, or the session ended
// otherwise, and then reports done. Meanwhile the server's own requests
// can never be answered by the client: drain returns error responses for
// them, for the SDK to read as the client's answers, so that no handler
// waits on the client forever while its own answer is owed.
func (f *inFlight) drain() (answers []byte, done bool) {
	for {
		f.mu.Lock()
		if f.ended || len(f.owed) == 0 {
			f.mu.Unlock()
			return nil, true
		}
		for id := range f.asked {
			b, _ := json.Marshal(id.Raw()) // an int64 or a string
			answers = append(answers, errorResponse(b, jsonrpc.CodeInternalError, "the client closed its input before answering")...)
			answers = append(answers, '\n')
			delete(f.asked, id)
		}
		change := f.change
		f.mu.Unlock()
		if len(answers) > 0 {
			return answers, false
		}
		<-change
	}
}

// cancelled returns the id of the request a notifications/cancelled names.
func cancelled(n *jsonrpc.Request) (jsonrpc.ID, bool) {
	if n.Method != "notifications/cancelled" {
		return jsonrpc.ID{}, false
	}
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(n.Params, &p) != nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	return id, err == nil && id.IsValid()
}

// filter is the reader the SDK's transport reads stdin through. Read hands
// on one good line at a time.
type filter struct {
	in      *bufio.Reader
	closer  io.Closer
	out     *lockedWriter
	calls   *inFlight
	logger  *slog.Logger
	maxLine int

	pending []byte // the rest of the current good line
	err     error  // the input's end, returned once pending is empty
}

func (f *filter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if f.err != nil {
			answers, done := f.calls.drain()
			if done {
				return 0, f.err
			}
			f.pending = answers
			continue
		}
		line, tooLong, err := f.readLine()
		if err != nil {
			f.err = err
		}
		if tooLong {
			f.answer(invalidRequest(nil, fmt.Sprintf("Invalid Request: the message is longer than %d bytes", f.maxLine)))
			continue
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		msgs, resp := check(line)
		if resp != nil {
			f.answer(resp)
			continue
		}
		f.calls.read(msgs)
		f.pending = append(line, '\n')
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// readLine reads the next line without its newline. A line over maxLine is
// read to its end and dropped, so that memory stays bounded.
func (f *filter) readLine() (line []byte, tooLong bool, err error) {
	for {
		chunk, err := f.in.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > f.maxLine+1 { // +1: the newline
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), tooLong, err
	}
}

// answer writes an error response for a line the SDK never sees. A failed
// write means the client is gone; the next read will say so.
func (f *filter) answer(resp []byte) {
	f.logger.Warn("mcp stdio: answered a line that is not a JSON-RPC message", "response", string(resp))
	f.out.writeAnswer(append(resp, '\n'))
}

// Close is the SDK closing the session: nothing more will be answered.
func (f *filter) Close() error {
	f.calls.end()
	return f.closer.Close()
}

// Check returns nil when line is a JSON-RPC message, or a batch of them,
// that the SDK can take, and otherwise the error response to send for it.
func Check(line []byte) []byte {
	_, resp := check(line)
	return resp
}

// check is Check that also returns the messages of a line it passes.
func check(line []byte) ([]jsonrpc.Message, []byte) {
	var v any
	if err := json.Unmarshal(line, &v); err != nil {
		// The error names the problem and its offset, never the content.
		return nil, errorResponse(nil, jsonrpc.CodeParseError, "Parse error: "+err.Error())
	}
	if batch, ok := v.([]any); ok {
		if len(batch) == 0 {
			return nil, invalidRequest(nil, "Invalid Request: empty batch")
		}
		var raws []json.RawMessage
		_ = json.Unmarshal(line, &raws) // valid JSON array: cannot fail
		msgs := make([]jsonrpc.Message, 0, len(raws))
		for _, raw := range raws {
			m, err := jsonrpc.DecodeMessage(raw)
			if err != nil {
				return nil, invalidRequest(nil, "Invalid Request: in batch: "+err.Error())
			}
			msgs = append(msgs, m)
		}
		return msgs, nil
	}
	m, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		return nil, invalidRequest(requestID(line), "Invalid Request: "+err.Error())
	}
	return []jsonrpc.Message{m}, nil
}

// decode returns the messages of a frame the SDK wrote: one, or a batch.
func decode(frame []byte) []jsonrpc.Message {
	if len(frame) > 0 && frame[0] == '[' {
		var raws []json.RawMessage
		if json.Unmarshal(frame, &raws) != nil {
			return nil
		}
		msgs := make([]jsonrpc.Message, 0, len(raws))
		for _, raw := range raws {
			if m, err := jsonrpc.DecodeMessage(raw); err == nil {
				msgs = append(msgs, m)
			}
		}
		return msgs
	}
	if m, err := jsonrpc.DecodeMessage(frame); err == nil {
		return []jsonrpc.Message{m}
	}
	return nil
}

// requestID is the id of a message that was not a valid request, as sent,
// when it is a usable one (a string or a number), so that the client can
// match the error to its call; otherwise null, as JSON-RPC asks.
func requestID(line []byte) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil {
		return nil
	}
	var id any
	if json.Unmarshal(m["id"], &id) != nil {
		return nil
	}
	switch id.(type) {
	case string, float64:
		return m["id"]
	}
	return nil
}

func invalidRequest(id json.RawMessage, message string) []byte {
	return errorResponse(id, jsonrpc.CodeInvalidRequest, message)
}

type wireError struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   wireErrorDetail `json:"error"`
}

type wireErrorDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func errorResponse(id json.RawMessage, code int, message string) []byte {
	if id == nil {
		id = json.RawMessage("null")
	}
	// id is a JSON string, number or null and the rest are plain values:
	// Marshal cannot fail.
	b, _ := json.Marshal(wireError{JSONRPC: "2.0", ID: id, Error: wireErrorDetail{Code: code, Message: message}})
	return b
}
