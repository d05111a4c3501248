package acp

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		line     string
		want     lineKind
		response bool
		id       string
	}{
		{`{"jsonrpc":"2.0","method":"session/update","params":{}}`, lineJSONRPC, false, ""},
		{`{"method":"session/update","params":{},"jsonrpc":"2.0"}`, lineJSONRPC, false, ""},
		{`{ "jsonrpc" : "2.0" , "id" : 7 , "result" : null }`, lineJSONRPC, true, "7"},
		{`{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}`, lineJSONRPC, true, `"a"`},
		// A response whose result mentions a method is still a response.
		{`{"jsonrpc":"2.0","id":3,"result":{"method":"x"}}`, lineJSONRPC, true, "3"},
		// Neither a method nor a result: the connection answers it.
		{`{"jsonrpc":"2.0","id":4}`, lineJSONRPC, false, "4"},
		// Malformed after its jsonrpc member: the connection answers ParseError.
		{`{"jsonrpc":"2.0","method":"x",`, lineJSONRPC, false, ""},
		{`[{"jsonrpc":"2.0","id":1,"result":{}}]`, lineJSONRPC, false, ""},
		// Legacy lines whose data holds the text or a member "jsonrpc".
		{`{"type":"log","data":{"message":"jsonrpc"}}`, lineLegacy, false, ""},
		{`{"type":"log","data":{"message":"the \"jsonrpc\" member"}}`, lineLegacy, false, ""},
		{`{"type":"log","data":{"jsonrpc":"2.0","method":"x"}}`, lineLegacy, false, ""},
		{`{"type":"progress","data":{"percentage":40}}`, lineLegacy, false, ""},
		// Exact member names, as pkg/jsonrpc reads them.
		{`{"json\u0072pc":"2.0","type":"log"}`, lineLegacy, false, ""},
		{`{"JSONRPC":"2.0","type":"log"}`, lineLegacy, false, ""},
		{`{"type":"log","data":{"message":"jsonrpc"}`, lineNotJSON, false, ""},
		{`{"type":tru}`, lineNotJSON, false, ""},
		{`{"a" "jsonrpc"}`, lineNotJSON, false, ""},
		{`hello "jsonrpc"`, lineNotJSON, false, ""},
		{"{\"jsonrpc\":\"\xff\"}", lineNotUTF8, false, ""},
	} {
		kind, members := classify([]byte(tt.line))
		if kind != tt.want || members.isResponse() != tt.response || string(members.id) != tt.id {
			t.Errorf("classify(%s) = %d, response %v, id %q; want %d, %v, %q", tt.line, kind, members.isResponse(), members.id, tt.want, tt.response, tt.id)
		}
	}
}

// FuzzClassify checks the line classifier against encoding/json: a line is
// legacy exactly when it is a valid JSON object without a top-level
// "jsonrpc" member, and a valid object with one is JSON-RPC. Lines with
// escapes or invalid UTF-8 are only checked not to panic, since
// encoding/json unescapes member names (pkg/jsonrpc, like the classifier,
// does not) and replaces invalid UTF-8.
func FuzzClassify(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"update":{}}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"method":"x"}}`,
		`{"type":"log","data":{"message":"jsonrpc"}}`,
		`{"type":"log","data":{"jsonrpc":"2.0"}}`,
		`{"type":"log","jsonrpc":1}`,
		`[1]`, `{}`, `{"a":[{"jsonrpc":1}],"b":"}"}`, "{\"a\":\"\xff\"}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if len(line) == 0 {
			return
		}
		kind, _ := classify(line)
		var members map[string]json.RawMessage
		if bytes.IndexByte(line, '\\') >= 0 || !utf8.Valid(line) || json.Unmarshal(line, &members) != nil || line[0] != '{' {
			return
		}
		_, hasJSONRPC := members["jsonrpc"]
		switch {
		case hasJSONRPC && kind != lineJSONRPC:
			t.Fatalf("%q has a jsonrpc member, classified %d", line, kind)
		case !hasJSONRPC && kind != lineLegacy:
			t.Fatalf("%q has no jsonrpc member, classified %d", line, kind)
		}
	})
}
