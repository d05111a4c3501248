package acp

import (
	"bytes"
	"encoding/json"
	"errors"
)

// A small walker over JSON the connection has already validated, for the
// one message that arrives by the hundred thousand: an ACP session/update.
// encoding/json would validate it twice more and reflect over a struct; this
// reads only the members the runner uses. It still checks bounds, so input
// that is not valid JSON yields an error, never a panic.

var errMalformed = errors.New("malformed JSON")

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the string starting at b[i] == '"'.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// valueEnd returns the index after the value starting at b[i], or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = stringEnd(b, i); i < 0 {
					return -1
				}
				i--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}

// eachMember calls fn with each member of the object b; fn returns false to
// stop early.
func eachMember(b []byte, fn func(key, val []byte) bool) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errMalformed
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return errMalformed
		}
		end := stringEnd(b, i)
		if end < 0 {
			return errMalformed
		}
		key := b[i+1 : end-1]
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return errMalformed
		}
		i = skipWS(b, i+1)
		vend := valueEnd(b, i)
		if vend < 0 || vend > len(b) {
			return errMalformed
		}
		if !fn(key, b[i:vend]) {
			return nil
		}
		i = skipWS(b, vend)
		if i >= len(b) {
			return errMalformed
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return nil
		default:
			return errMalformed
		}
	}
	return errMalformed
}

// eachElem calls fn with each element of the array b.
func eachElem(b []byte, fn func(val []byte)) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return errMalformed
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for i < len(b) {
		vend := valueEnd(b, i)
		if vend < 0 {
			return errMalformed
		}
		fn(b[i:vend])
		i = skipWS(b, vend)
		if i >= len(b) {
			return errMalformed
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case ']':
			return nil
		default:
			return errMalformed
		}
	}
	return errMalformed
}

// str reads a JSON string value; other values read as "".
func str(v []byte) string {
	if len(v) < 2 || v[0] != '"' {
		return ""
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner)
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}
