// Package jsonscan walks JSON without decoding it: the members of an
// object, the elements of an array, the extent of a value. It is for the
// hot paths (JSON-RPC frames, ACP session/update notifications) where
// encoding/json would validate a message again and reflect over a struct
// to read a few members. Every function checks bounds, so input that is not
// valid JSON yields an error or -1, never a panic; on input already checked
// by json.Valid they never fail.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrMalformed is returned for input that is not the JSON expected.
var ErrMalformed = errors.New("malformed JSON")

// SkipSpace returns the index of the first non-space byte at or after i.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// StringEnd returns the index after the string starting at b[i] == '"'.
func StringEnd(b []byte, i int) int {
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

// ValueEnd returns the index after the value starting at b[i], or -1.
func ValueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return StringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = StringEnd(b, i); i < 0 {
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

// EachMember calls fn with each member of the object b; fn returns false to
// stop early.
func EachMember(b []byte, fn func(key, val []byte) bool) error {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return ErrMalformed
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil
	}
	for i < len(b) {
		if b[i] != '"' {
			return ErrMalformed
		}
		end := StringEnd(b, i)
		if end < 0 {
			return ErrMalformed
		}
		key := b[i+1 : end-1]
		i = SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return ErrMalformed
		}
		i = SkipSpace(b, i+1)
		vend := ValueEnd(b, i)
		if vend < 0 || vend > len(b) {
			return ErrMalformed
		}
		if !fn(key, b[i:vend]) {
			return nil
		}
		i = SkipSpace(b, vend)
		if i >= len(b) {
			return ErrMalformed
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case '}':
			return nil
		default:
			return ErrMalformed
		}
	}
	return ErrMalformed
}

// EachElem calls fn with each element of the array b.
func EachElem(b []byte, fn func(val []byte)) error {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return ErrMalformed
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for i < len(b) {
		vend := ValueEnd(b, i)
		if vend < 0 {
			return ErrMalformed
		}
		fn(b[i:vend])
		i = SkipSpace(b, vend)
		if i >= len(b) {
			return ErrMalformed
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case ']':
			return nil
		default:
			return ErrMalformed
		}
	}
	return ErrMalformed
}

// String reads a JSON string value; other values read as "".
func String(v []byte) string {
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
