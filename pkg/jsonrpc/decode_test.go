package jsonrpc

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func TestDecodeMessageValid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		frame string
		want  Message
	}{
		{
			name:  "call with number id",
			frame: `{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}`,
			want:  &Request{ID: Int64ID(1), Method: "subtract", Params: json.RawMessage(`[42,23]`)},
		},
		{
			name:  "call with string id and named params",
			frame: ` {"id":"abc","params":{"a":1},"method":"m","jsonrpc":"2.0"} `,
			want:  &Request{ID: StringID("abc"), Method: "m", Params: json.RawMessage(`{"a":1}`)},
		},
		{
			name:  "number id keeps its literal",
			frame: `{"jsonrpc":"2.0","method":"m","id":1e3}`,
			want:  &Request{ID: ID{kind: idNumber, text: "1e3"}, Method: "m"},
		},
		{
			name:  "null id",
			frame: `{"jsonrpc":"2.0","method":"m","id":null}`,
			want:  &Request{ID: nullID, Method: "m"},
		},
		{
			name:  "notification",
			frame: `{"jsonrpc":"2.0","method":"update","params":[1,2,3]}`,
			want:  &Request{Method: "update", Params: json.RawMessage(`[1,2,3]`)},
		},
		{
			name:  "null params mean none",
			frame: `{"jsonrpc":"2.0","method":"m","params":null}`,
			want:  &Request{Method: "m"},
		},
		{
			name:  "escaped method and version",
			frame: `{"jsonrpc":"2\u002e0","method":"session\/update"}`,
			want:  &Request{Method: "session/update"},
		},
		{
			name:  "extra members are ignored",
			frame: `{"jsonrpc":"2.0","method":"m","x-extension":{"a":[1,{"b":"]}"}]}}`,
			want:  &Request{Method: "m"},
		},
		{
			name:  "result",
			frame: `{"jsonrpc":"2.0","result":{"ok":true},"id":7}`,
			want:  &Response{ID: Int64ID(7), Result: json.RawMessage(`{"ok":true}`)},
		},
		{
			name:  "null result",
			frame: `{"jsonrpc":"2.0","result":null,"id":"x"}`,
			want:  &Response{ID: StringID("x"), Result: json.RawMessage(`null`)},
		},
		{
			name:  "error with data",
			frame: `{"jsonrpc":"2.0","error":{"code":-32601,"message":"Method not found","data":{"m":"x"}},"id":3}`,
			want:  &Response{ID: Int64ID(3), Error: &Error{Code: -32601, Message: "Method not found", Data: json.RawMessage(`{"m":"x"}`)}},
		},
		{
			name:  "error with null id",
			frame: `{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}`,
			want:  &Response{ID: nullID, Error: &Error{Code: -32700, Message: "Parse error"}},
		},
		{
			name:  "batch with an invalid element",
			frame: `[{"jsonrpc":"2.0","method":"a","id":1},1,{"jsonrpc":"2.0","method":"b"}]`,
			want: &Batch{
				Messages: []Message{
					&Request{ID: Int64ID(1), Method: "a"},
					&Request{Method: "b"},
				},
				Invalid: []*DecodeError{invalid(nullID, "a message must be a JSON object")},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeMessage([]byte(tt.frame))
			if err != nil {
				t.Fatalf("DecodeMessage: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeMessage(%s)\n got %#v\nwant %#v", tt.frame, got, tt.want)
			}
		})
	}
}

func TestDecodeMessageInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		frame      string
		code       int
		id         ID
		isResponse bool
	}{
		{name: "empty", frame: ``, code: ParseError, id: nullID},
		{name: "truncated", frame: `{"jsonrpc":"2.0","method":"foobar,"params":"bar","baz]`, code: ParseError, id: nullID},
		{name: "trailing garbage", frame: `{"jsonrpc":"2.0","method":"m"} x`, code: ParseError, id: nullID},
		{name: "truncated batch", frame: `[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method"]`, code: ParseError, id: nullID},
		{name: "empty batch", frame: `[]`, code: InvalidRequest, id: nullID},
		{name: "not an object", frame: `"hello"`, code: InvalidRequest, id: nullID},
		{name: "no version", frame: `{"method":"m","id":1}`, code: InvalidRequest, id: Int64ID(1)},
		{name: "wrong version", frame: `{"jsonrpc":"1.0","method":"m","id":1}`, code: InvalidRequest, id: Int64ID(1)},
		{name: "version is a number", frame: `{"jsonrpc":2.0,"method":"m","id":"a"}`, code: InvalidRequest, id: StringID("a")},
		{name: "version key is case-sensitive", frame: `{"JSONRPC":"2.0","method":"m","id":1}`, code: InvalidRequest, id: Int64ID(1)},
		{name: "method is a number", frame: `{"jsonrpc":"2.0","method":1,"params":"bar","id":2}`, code: InvalidRequest, id: Int64ID(2)},
		{name: "params is a string", frame: `{"jsonrpc":"2.0","method":"m","params":"bar","id":2}`, code: InvalidRequest, id: Int64ID(2)},
		{name: "id is an object", frame: `{"jsonrpc":"2.0","method":"m","id":{"a":1}}`, code: InvalidRequest, id: nullID},
		{name: "id is a boolean", frame: `{"jsonrpc":"2.0","method":"m","id":true}`, code: InvalidRequest, id: nullID},
		{name: "duplicate method", frame: `{"jsonrpc":"2.0","method":"a","method":"b","id":1}`, code: InvalidRequest, id: Int64ID(1)},
		{name: "request with result", frame: `{"jsonrpc":"2.0","method":"m","result":1,"id":1}`, code: InvalidRequest, id: Int64ID(1)},
		{name: "neither method nor result", frame: `{"jsonrpc":"2.0","id":1}`, code: InvalidRequest, id: Int64ID(1)},
		{name: "result and error", frame: `{"jsonrpc":"2.0","result":1,"error":{"code":1,"message":"x"},"id":4}`, code: InvalidRequest, id: Int64ID(4), isResponse: true},
		{name: "response without id", frame: `{"jsonrpc":"2.0","result":1}`, code: InvalidRequest, id: nullID, isResponse: true},
		{name: "result with null id", frame: `{"jsonrpc":"2.0","result":1,"id":null}`, code: InvalidRequest, id: nullID, isResponse: true},
		{name: "error without code", frame: `{"jsonrpc":"2.0","error":{"message":"x"},"id":5}`, code: InvalidRequest, id: Int64ID(5), isResponse: true},
		{name: "error with fractional code", frame: `{"jsonrpc":"2.0","error":{"code":1.5,"message":"x"},"id":5}`, code: InvalidRequest, id: Int64ID(5), isResponse: true},
		{name: "error is a string", frame: `{"jsonrpc":"2.0","error":"bad","id":5}`, code: InvalidRequest, id: Int64ID(5), isResponse: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, err := DecodeMessage([]byte(tt.frame))
			var derr *DecodeError
			if !errors.As(err, &derr) {
				t.Fatalf("DecodeMessage(%s) = %#v, %v; want a *DecodeError", tt.frame, m, err)
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != tt.code {
				t.Errorf("code = %v, want %d", err, tt.code)
			}
			if derr.ID != tt.id {
				t.Errorf("id = %s, want %s", derr.ID, tt.id)
			}
			if derr.IsResponse != tt.isResponse {
				t.Errorf("IsResponse = %v, want %v", derr.IsResponse, tt.isResponse)
			}
		})
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  Message
		want string
		// back is what decoding the encoding yields, when not msg itself.
		back Message
	}{
		{
			name: "request",
			msg:  &Request{ID: Int64ID(1), Method: "m", Params: json.RawMessage(`{"a":1}`)},
			want: `{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1}}`,
		},
		{
			name: "notification with a method needing escapes",
			msg:  &Request{Method: "a\"b\n\u00e9"},
			want: `{"jsonrpc":"2.0","method":"a\"b\n\u00e9"}`,
		},
		{
			name: "response with no result",
			msg:  &Response{ID: StringID("s")},
			want: `{"jsonrpc":"2.0","id":"s","result":null}`,
			back: &Response{ID: StringID("s"), Result: json.RawMessage(`null`)},
		},
		{
			name: "error response",
			msg:  &Response{ID: nullID, Error: &Error{Code: ParseError, Message: "Parse error", Data: json.RawMessage(`"x"`)}},
			want: `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":"x"}}`,
		},
		{
			name: "batch",
			msg:  &Batch{Messages: []Message{&Request{Method: "a"}, &Response{ID: Int64ID(2), Result: json.RawMessage(`3`)}}},
			want: `[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","id":2,"result":3}]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := json.Marshal(tt.msg)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			var want any
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			var gotV any
			if err := json.Unmarshal(got, &gotV); err != nil {
				t.Fatalf("invalid JSON %s: %v", got, err)
			}
			if !reflect.DeepEqual(gotV, want) {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			back, err := DecodeMessage(got)
			if err != nil {
				t.Fatalf("decoding %s: %v", got, err)
			}
			wantBack := tt.back
			if wantBack == nil {
				wantBack = tt.msg
			}
			if !reflect.DeepEqual(back, wantBack) {
				t.Errorf("round trip: got %#v, want %#v", back, wantBack)
			}
		})
	}
}

func TestIDJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    ID
		wantErr bool
	}{
		{in: `12`, want: Int64ID(12)},
		{in: `-3`, want: Int64ID(-3)},
		{in: `"12"`, want: StringID("12")},
		{in: `null`, want: nullID},
		{in: `1.5`, want: ID{kind: idNumber, text: "1.5"}},
		{in: `0`, want: Int64ID(0)},
		{in: `-0`, want: ID{kind: idNumber, text: "-0"}},
		{in: `9223372036854775807`, want: Int64ID(9223372036854775807)},
		{in: `9223372036854775808`, want: ID{kind: idNumber, text: "9223372036854775808"}},
		{in: `true`, wantErr: true},
		{in: `[1]`, wantErr: true},
		{in: `"x`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			var id ID
			err := json.Unmarshal([]byte(tt.in), &id)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Unmarshal(%s) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if id != tt.want {
				t.Errorf("Unmarshal(%s) = %s, want %s", tt.in, id, tt.want)
			}
			out, _ := json.Marshal(id)
			if string(out) != tt.in {
				t.Errorf("Marshal = %s, want %s", out, tt.in)
			}
		})
	}
	if StringID("12") == Int64ID(12) {
		t.Error(`StringID("12") == Int64ID(12); a string id must not match a number`)
	}
}

func TestIsServerError(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]bool{
		-32000: true, ServerErrorMin: true, -32050: true,
		-31999: false, -32100: false, InternalError: false, RequestCancelled: false,
	} {
		if got := IsServerError(code); got != want {
			t.Errorf("IsServerError(%d) = %v, want %v", code, got, want)
		}
	}
}
