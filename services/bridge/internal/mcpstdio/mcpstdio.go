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
	w := &lockedWriter{w: out}
	return &mcp.IOTransport{
		Reader: &filter{in: bufio.NewReader(in), closer: in, out: w, logger: logger, maxLine: MaxLineBytes},
		Writer: w,
		// The filter enforces the frame limit, line by line, and answers
		// an overlong line instead of ending the session.
		MaxLineLength: -1,
	}
}

// lockedWriter serialises the filter's error responses with the SDK's
// writes: each is one whole line, and lines must not interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.WriteCloser
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return l.w.Close() }

// filter is the reader the SDK's transport reads stdin through. Read hands
// on one good line at a time.
type filter struct {
	in      *bufio.Reader
	closer  io.Closer
	out     io.Writer
	logger  *slog.Logger
	maxLine int

	pending []byte // the rest of the current good line
	err     error  // the input's end, returned once pending is empty
}

func (f *filter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if f.err != nil {
			return 0, f.err
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
		if resp := Check(line); resp != nil {
			f.answer(resp)
			continue
		}
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
	_, _ = f.out.Write(append(resp, '\n'))
}

func (f *filter) Close() error { return f.closer.Close() }

// Check returns nil when line is a JSON-RPC message, or a batch of them,
// that the SDK can take, and otherwise the error response to send for it.
func Check(line []byte) []byte {
	var v any
	if err := json.Unmarshal(line, &v); err != nil {
		// The error names the problem and its offset, never the content.
		return errorResponse(nil, jsonrpc.CodeParseError, "Parse error: "+err.Error())
	}
	if batch, ok := v.([]any); ok {
		if len(batch) == 0 {
			return invalidRequest(nil, "Invalid Request: empty batch")
		}
		var raws []json.RawMessage
		_ = json.Unmarshal(line, &raws) // valid JSON array: cannot fail
		for _, raw := range raws {
			if _, err := jsonrpc.DecodeMessage(raw); err != nil {
				return invalidRequest(nil, "Invalid Request: in batch: "+err.Error())
			}
		}
		return nil
	}
	if _, err := jsonrpc.DecodeMessage(line); err != nil {
		return invalidRequest(requestID(line), "Invalid Request: "+err.Error())
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
