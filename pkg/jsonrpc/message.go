package jsonrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Error codes. The first five are the JSON-RPC 2.0 spec's own.
const (
	ParseError     = -32700
	InvalidRequest = -32600
	MethodNotFound = -32601
	InvalidParams  = -32602
	InternalError  = -32603

	// RequestCancelled answers a request whose caller cancelled it. LSP and
	// ACP both use this value, so their clients recognise it.
	RequestCancelled = -32800

	// ServerErrorMin and ServerErrorMax bound the range the spec reserves for
	// implementation-defined server errors; see IsServerError.
	ServerErrorMin = -32099
	ServerErrorMax = -32000
)

// IsServerError reports whether code is in the range the spec reserves for
// implementation-defined server errors.
func IsServerError(code int) bool {
	return code >= ServerErrorMin && code <= ServerErrorMax
}

// Error is a JSON-RPC error object. A handler returns one to choose exactly
// what the peer sees; Call returns the peer's as an *Error.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// NewError returns an error object with the given code and message.
func NewError(code int, message string) *Error {
	return &Error{Code: code, Message: message}
}

func (e *Error) Error() string {
	if len(e.Data) > 0 {
		return fmt.Sprintf("jsonrpc error %d: %s (data: %s)", e.Code, e.Message, e.Data)
	}
	return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message)
}

type idKind uint8

const (
	idAbsent idKind = iota
	idNull
	idNumber
	idString
)

// ID is a request id. Peers choose numbers or strings and expect their own
// back byte for byte, so a number that is not a plain integer keeps its
// literal text rather than being converted through float64. The zero ID is
// absent: the id of a notification. ID is comparable and can be a map key.
type ID struct {
	kind idKind
	// num is a number id written as a plain integer, the usual kind, held
	// without allocating.
	num int64
	// text is a string id's value, or the literal of any other number.
	text string
}

// nullID is the id of an error response to a message whose own id could not
// be read, as the spec prescribes.
var nullID = ID{kind: idNull}

// Int64ID returns a numeric id.
func Int64ID(n int64) ID { return ID{kind: idNumber, num: n} }

// StringID returns a string id.
func StringID(s string) ID { return ID{kind: idString, text: s} }

// IsZero reports whether the id is absent, which makes a request a
// notification.
func (id ID) IsZero() bool { return id.kind == idAbsent }

// IsNull reports whether the id is JSON null.
func (id ID) IsNull() bool { return id.kind == idNull }

// String returns the id as it appears on the wire, for logs.
func (id ID) String() string {
	switch id.kind {
	case idNumber:
		return string(appendID(nil, id))
	case idString:
		return strconv.Quote(id.text)
	case idNull:
		return "null"
	}
	return "<absent>"
}

// MarshalJSON encodes the id; an absent id encodes as null.
func (id ID) MarshalJSON() ([]byte, error) { return appendID(nil, id), nil }

// UnmarshalJSON accepts what the spec allows as an id: a string, a number or
// null.
func (id *ID) UnmarshalJSON(data []byte) error {
	if !json.Valid(data) {
		return errors.New("jsonrpc: id is not valid JSON")
	}
	parsed, ok := parseID(trimSpace(data))
	if !ok {
		return errors.New("jsonrpc: id must be a string, a number or null")
	}
	*id = parsed
	return nil
}

// int64 returns the id as an int64 when it is a plain integer, as the ids
// we allocate ourselves are.
func (id ID) int64() (int64, bool) {
	return id.num, id.kind == idNumber && id.text == ""
}

// Message is a decoded frame: a *Request, a *Response or a *Batch.
type Message interface {
	json.Marshaler
	message()
}

// Request is a call, or a notification when ID is zero.
type Request struct {
	ID     ID
	Method string
	// Params is nil when the request has none; otherwise a JSON object or
	// array, as the spec requires.
	Params json.RawMessage
}

// IsNotification reports whether the request expects no response.
func (r *Request) IsNotification() bool { return r.ID.IsZero() }

// DecodeParams unmarshals the params into v. On failure it returns an
// InvalidParams *Error, so a handler can return it unchanged.
func (r *Request) DecodeParams(v any) error {
	params := r.Params
	if params == nil {
		params = []byte("null")
	}
	if err := json.Unmarshal(params, v); err != nil {
		return &Error{Code: InvalidParams, Message: "Invalid params: " + err.Error()}
	}
	return nil
}

// MarshalJSON encodes the request.
func (r Request) MarshalJSON() ([]byte, error) { return appendRequest(nil, &r), nil }

func (*Request) message() {}

// Response answers a request: Error is nil on success. Result holds the raw
// result, which is JSON null rather than nil when the method returns nothing.
type Response struct {
	ID     ID
	Result json.RawMessage
	Error  *Error
}

// MarshalJSON encodes the response.
func (r Response) MarshalJSON() ([]byte, error) { return appendResponse(nil, &r), nil }

func (*Response) message() {}

// Batch is a frame holding a JSON array of messages.
type Batch struct {
	// Messages are the valid elements, in order.
	Messages []Message
	// Invalid are the elements that are not valid messages. The spec has a
	// server answer each one inside the batch response, and allows batch
	// responses in any order, so they need no position.
	Invalid []*DecodeError
}

// MarshalJSON encodes the valid messages as a JSON array.
func (b Batch) MarshalJSON() ([]byte, error) {
	out := []byte{'['}
	for i, m := range b.Messages {
		if i > 0 {
			out = append(out, ',')
		}
		enc, err := m.MarshalJSON()
		if err != nil {
			return nil, err
		}
		out = append(out, enc...)
	}
	return append(out, ']'), nil
}

func (*Batch) message() {}

// The append functions encode by hand: they are on every call's path, and
// encoding/json would reflect over these small fixed shapes and then compact
// and re-validate the raw members it was given.

const versionMember = `{"jsonrpc":"2.0"`

func appendRequest(b []byte, r *Request) []byte {
	b = append(b, versionMember...)
	if !r.ID.IsZero() {
		b = append(b, `,"id":`...)
		b = appendID(b, r.ID)
	}
	b = append(b, `,"method":`...)
	b = appendString(b, r.Method)
	if r.Params != nil {
		b = append(b, `,"params":`...)
		b = append(b, r.Params...)
	}
	return append(b, '}')
}

func appendResponse(b []byte, r *Response) []byte {
	b = append(b, versionMember...)
	b = append(b, `,"id":`...)
	b = appendID(b, r.ID)
	if r.Error != nil {
		b = append(b, `,"error":{"code":`...)
		b = strconv.AppendInt(b, int64(r.Error.Code), 10)
		b = append(b, `,"message":`...)
		b = appendString(b, r.Error.Message)
		if len(r.Error.Data) > 0 {
			b = append(b, `,"data":`...)
			b = append(b, r.Error.Data...)
		}
		return append(b, "}}"...)
	}
	b = append(b, `,"result":`...)
	if r.Result == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, r.Result...)
	}
	return append(b, '}')
}

func appendID(b []byte, id ID) []byte {
	switch id.kind {
	case idNumber:
		if id.text == "" {
			return strconv.AppendInt(b, id.num, 10)
		}
		return append(b, id.text...)
	case idString:
		return appendString(b, id.text)
	}
	return append(b, "null"...)
}

// appendString appends s as a JSON string. Method names and ids are almost
// always plain ASCII, which needs no escaping; anything else goes through
// encoding/json so the escaping rules live in one place.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' {
			enc, _ := json.Marshal(s) // cannot fail for a string
			return append(b, enc...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
