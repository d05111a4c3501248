package jsonrpc

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/pkg/jsonscan"
)

// DecodeError says why a frame, or an element of a batch, is not a valid
// message, and carries what is needed to answer it.
type DecodeError struct {
	// ID is the message's id if it could be read, and null otherwise: the id
	// the error response must carry.
	ID ID
	// Err is the error object to answer with: ParseError or InvalidRequest.
	Err *Error
	// IsResponse reports that the message had a result or an error member and
	// no method, so it was meant as a response. It must not be answered: its
	// id names one of our requests, and an error response with that id would
	// look to the peer like the answer to a request of its own.
	IsResponse bool
}

func (e *DecodeError) Error() string { return e.Err.Error() }

func (e *DecodeError) Unwrap() error { return e.Err }

func invalid(id ID, detail string) *DecodeError {
	return &DecodeError{ID: id, Err: &Error{Code: InvalidRequest, Message: "Invalid Request: " + detail}}
}

// DecodeMessage decodes one frame: a request, a notification, a response, or
// a batch of them. It returns a *DecodeError for invalid JSON (ParseError)
// and for valid JSON that is not a JSON-RPC 2.0 message (InvalidRequest),
// including an empty batch, which the spec answers with a single error. The
// returned message's raw members alias data.
func DecodeMessage(data []byte) (Message, error) {
	m, derr := decodeFrame(data)
	if derr != nil {
		return nil, derr // not a typed nil in a non-nil error
	}
	return m, nil
}

func decodeFrame(data []byte) (Message, *DecodeError) {
	if !json.Valid(data) {
		// json.Valid says only yes or no; this slow path finds out where.
		detail := json.Unmarshal(data, new(json.RawMessage))
		msg := "Parse error"
		if detail != nil {
			msg += ": " + detail.Error()
		}
		return nil, &DecodeError{ID: nullID, Err: &Error{Code: ParseError, Message: msg}}
	}
	i := jsonscan.SkipSpace(data, 0)
	if data[i] == '[' {
		return decodeBatch(data[i:])
	}
	return decodeValue(data[i:])
}

func decodeBatch(arr []byte) (Message, *DecodeError) {
	b := &Batch{}
	var it iter
	it.init(arr)
	for it.nextElem() {
		m, derr := decodeValue(it.val)
		if derr != nil {
			b.Invalid = append(b.Invalid, derr)
			continue
		}
		b.Messages = append(b.Messages, m)
	}
	if len(b.Messages) == 0 && len(b.Invalid) == 0 {
		return nil, invalid(nullID, "empty batch")
	}
	return b, nil
}

// Bits of member in decodeValue, for catching duplicate members: JSON leaves
// their meaning open, and a peer and a proxy reading different ones is how
// request smuggling works.
const (
	hasJSONRPC = 1 << iota
	hasID
	hasMethod
	hasParams
	hasResult
	hasError
)

// decodeValue decodes one message, which must be a valid JSON value.
func decodeValue(v []byte) (Message, *DecodeError) {
	if v[0] != '{' {
		return nil, invalid(nullID, "a message must be a JSON object")
	}
	var (
		seen, dup                              int
		version, id, method, params, res, rerr []byte
	)
	var it iter
	it.init(v)
	for it.nextMember() {
		var bit int
		switch string(it.key) {
		case "jsonrpc":
			bit, version = hasJSONRPC, it.val
		case "id":
			bit, id = hasID, it.val
		case "method":
			bit, method = hasMethod, it.val
		case "params":
			bit, params = hasParams, it.val
		case "result":
			bit, res = hasResult, it.val
		case "error":
			bit, rerr = hasError, it.val
		default:
			continue // the spec does not forbid extra members
		}
		dup |= seen & bit
		seen |= bit
	}

	// The id comes first so that every later complaint can echo it.
	msgID := nullID
	idOK := true
	if seen&hasID != 0 {
		msgID, idOK = parseID(id)
		if !idOK {
			msgID = nullID
		}
	}
	isResponse := seen&hasMethod == 0 && seen&(hasResult|hasError) != 0
	fail := func(detail string) *DecodeError {
		d := invalid(msgID, detail)
		d.IsResponse = isResponse
		return d
	}

	switch {
	case dup != 0:
		return nil, fail("duplicate member")
	case seen&hasJSONRPC == 0:
		return nil, fail(`missing "jsonrpc" member`)
	case !isVersion2(version):
		return nil, fail(`"jsonrpc" must be "2.0"`)
	case !idOK:
		return nil, fail("id must be a string, a number or null")
	}

	if seen&hasMethod != 0 {
		if seen&(hasResult|hasError) != 0 {
			return nil, fail("a request cannot have a result or an error")
		}
		name, ok := parseString(method)
		if !ok {
			return nil, fail("method must be a string")
		}
		req := &Request{Method: name}
		if seen&hasID != 0 {
			req.ID = msgID
		}
		if seen&hasParams != 0 {
			switch params[0] {
			case '{', '[':
				req.Params = json.RawMessage(params)
			case 'n':
				// Absent in all but spelling: encoders commonly write a nil
				// params as null, and rejecting those peers helps no one.
			default:
				return nil, fail("params must be an object or an array")
			}
		}
		return req, nil
	}

	switch {
	case !isResponse:
		return nil, fail(`missing "method" member`)
	case seen&hasResult != 0 && seen&hasError != 0:
		return nil, fail("a response cannot have both a result and an error")
	case seen&hasID == 0:
		return nil, fail("a response must have an id")
	case seen&hasParams != 0:
		return nil, fail("a response cannot have params")
	}
	resp := &Response{ID: msgID}
	if seen&hasResult != 0 {
		if msgID.IsNull() {
			// Only an error may answer a message whose id could not be read.
			return nil, fail("a result needs a non-null id")
		}
		resp.Result = json.RawMessage(res)
		return resp, nil
	}
	e, ok := parseErrorObject(rerr)
	if !ok {
		return nil, fail("error must be an object with an integer code and a string message")
	}
	resp.Error = e
	return resp, nil
}

func isVersion2(v []byte) bool {
	if string(v) == `"2.0"` {
		return true
	}
	s, ok := parseString(v) // the same string, escaped
	return ok && s == "2.0"
}

func parseID(v []byte) (ID, bool) {
	switch c := v[0]; {
	case c == 'n':
		return nullID, true
	case c == '"':
		s, ok := parseString(v)
		return ID{kind: idString, text: s}, ok
	case c == '-' || (c >= '0' && c <= '9'):
		if n, ok := plainInt(v); ok {
			return ID{kind: idNumber, num: n}, true
		}
		return ID{kind: idNumber, text: string(v)}, true
	}
	return ID{}, false
}

// plainInt parses a JSON number written as an integer the way
// strconv.AppendInt writes it back, so that holding it as an int64 loses
// nothing of the literal.
func plainInt(v []byte) (int64, bool) {
	digits := v
	if len(v) > 0 && v[0] == '-' {
		digits = v[1:]
	}
	if len(digits) == 0 || len(digits) > 19 || (digits[0] == '0' && len(v) > 1) {
		return 0, false // empty, too long for int64, or a leading zero or -0
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	if v[0] == '-' {
		n = -n
	}
	return n, true
}

func parseErrorObject(v []byte) (*Error, bool) {
	if v[0] != '{' {
		return nil, false
	}
	var (
		e               Error
		hasCode, hasMsg bool
		code, msg       []byte
		it              iter
	)
	it.init(v)
	for it.nextMember() {
		switch string(it.key) {
		case "code":
			if hasCode {
				return nil, false
			}
			hasCode, code = true, it.val
		case "message":
			if hasMsg {
				return nil, false
			}
			hasMsg, msg = true, it.val
		case "data":
			if e.Data != nil {
				return nil, false
			}
			e.Data = json.RawMessage(it.val)
		}
	}
	if !hasCode || !hasMsg {
		return nil, false
	}
	n, err := strconv.Atoi(string(code))
	if err != nil {
		return nil, false
	}
	e.Code = n
	if e.Message, hasMsg = parseString(msg); !hasMsg {
		return nil, false
	}
	return &e, true
}

// parseString decodes a JSON string value; ok is false for any other value.
func parseString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	inner := v[1 : len(v)-1]
	plain := true
	for _, c := range inner {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain || (bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner)) {
		return string(inner), true
	}
	// Escapes, or invalid UTF-8 that encoding/json replaces with U+FFFD so
	// that strings we hand out re-encode to valid JSON.
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	return s, true
}

// iter walks the members of an object or the elements of an array in a
// document already checked by json.Valid. That check is what lets it skip
// nested values by counting brackets instead of parsing them, and lets the
// decoder keep raw members as sub-slices instead of copying them.
type iter struct {
	b        []byte
	i        int
	key, val []byte
}

func (it *iter) init(b []byte) {
	it.b, it.i = b, 1 // past the opening bracket
}

func (it *iter) nextElem() bool {
	it.i = jsonscan.SkipSpace(it.b, it.i)
	switch it.b[it.i] {
	case ']', '}':
		return false
	case ',':
		it.i = jsonscan.SkipSpace(it.b, it.i+1)
	}
	end := jsonscan.ValueEnd(it.b, it.i)
	it.val = it.b[it.i:end]
	it.i = end
	return true
}

func (it *iter) nextMember() bool {
	if !it.nextElem() {
		return false
	}
	key := it.val
	if bytes.IndexByte(key, '\\') < 0 {
		it.key = key[1 : len(key)-1]
	} else {
		s, _ := parseString(key)
		it.key = []byte(s)
	}
	it.i = jsonscan.SkipSpace(it.b, it.i) // at the colon
	it.i = jsonscan.SkipSpace(it.b, it.i+1)
	end := jsonscan.ValueEnd(it.b, it.i)
	it.val = it.b[it.i:end]
	it.i = end
	return true
}

func trimSpace(b []byte) []byte {
	b = b[jsonscan.SkipSpace(b, 0):]
	for len(b) > 0 {
		switch b[len(b)-1] {
		case ' ', '\t', '\n', '\r':
			b = b[:len(b)-1]
		default:
			return b
		}
	}
	return b
}
