package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

func FuzzDecodeMessage(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}`,
		`{"jsonrpc":"2.0","method":"subtract","params":{"subtrahend":23,"minuend":42},"id":"a"}`,
		`{"jsonrpc":"2.0","method":"update","params":[1,2,3,4,5]}`,
		`{"jsonrpc":"2.0","method":"session/prompt","params":{"_meta":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},"id":null}`,
		`{"jsonrpc":"2.0","result":19,"id":1}`,
		`{"jsonrpc":"2.0","result":null,"id":"x"}`,
		`{"jsonrpc":"2.0","error":{"code":-32601,"message":"Method not found","data":[1]},"id":"1"}`,
		`{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}`,
		`[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method":"notify_hello","params":[7]},{"foo":"boo"},1]`,
		`[]`,
		`[1,2,3]`,
		`{"jsonrpc":"2.0","method":"foobar,"params":"bar","baz]`,
		`{"jsonrpc":"2\u002e0","method":"\ud83d\ude00","id":1e400}`,
		`{"jsonrpc":"2.0","method":"a","method":"b"}`,
		"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\xfe\"}",
		` {"id" : -0.5e-3 , "method" : "x" , "jsonrpc" : "2.0" } `,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := DecodeMessage(data)
		if err != nil {
			var derr *DecodeError
			if !errors.As(err, &derr) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			if c := derr.Err.Code; c != ParseError && c != InvalidRequest {
				t.Fatalf("code %d, want ParseError or InvalidRequest", c)
			}
			if c := derr.Err.Code; c == ParseError && json.Valid(data) {
				t.Fatalf("ParseError for valid JSON %q", data)
			}
			checkEncodes(t, &Response{ID: derr.ID, Error: derr.Err})
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if b, ok := msg.(*Batch); ok {
			for _, d := range b.Invalid {
				checkEncodes(t, &Response{ID: d.ID, Error: d.Err})
			}
			if len(b.Messages) == 0 {
				return // nothing valid to encode; an empty array would not decode
			}
		}
		// Encoding is a fixed point after one decode: what we send decodes to
		// what we meant, and re-encodes byte for byte.
		enc1 := checkEncodes(t, msg)
		back, err := DecodeMessage(enc1)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc1, err)
		}
		enc2 := checkEncodes(t, back)
		if !bytes.Equal(enc1, enc2) {
			t.Fatalf("encoding is not stable:\n%s\n%s", enc1, enc2)
		}
		checkSame(t, msg, back)
	})
}

// checkEncodes encodes m and checks the result is valid JSON.
func checkEncodes(t *testing.T, m Message) []byte {
	t.Helper()
	enc, err := m.MarshalJSON()
	if err != nil {
		t.Fatalf("encoding %#v: %v", m, err)
	}
	if !json.Valid(enc) {
		t.Fatalf("encoding %#v gave invalid JSON %q", m, enc)
	}
	return enc
}

// checkSame checks that the decoded b means the same as a: ids, methods and
// codes equal, raw members equal up to insignificant whitespace.
func checkSame(t *testing.T, a, b Message) {
	t.Helper()
	switch a := a.(type) {
	case *Request:
		b, ok := b.(*Request)
		if !ok || a.ID != b.ID || a.Method != b.Method || !sameJSON(a.Params, b.Params) {
			t.Fatalf("request changed: %#v -> %#v", a, b)
		}
	case *Response:
		b, ok := b.(*Response)
		if !ok || a.ID != b.ID || !sameJSON(a.Result, b.Result) || (a.Error == nil) != (b.Error == nil) {
			t.Fatalf("response changed: %#v -> %#v", a, b)
		}
		if a.Error != nil && (a.Error.Code != b.Error.Code || a.Error.Message != b.Error.Message || !sameJSON(a.Error.Data, b.Error.Data)) {
			t.Fatalf("error changed: %#v -> %#v", a.Error, b.Error)
		}
	case *Batch:
		b, ok := b.(*Batch)
		if !ok || len(a.Messages) != len(b.Messages) || len(b.Invalid) != 0 {
			t.Fatalf("batch changed: %#v -> %#v", a, b)
		}
		for i := range a.Messages {
			checkSame(t, a.Messages[i], b.Messages[i])
		}
	}
}

func sameJSON(a, b []byte) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}
