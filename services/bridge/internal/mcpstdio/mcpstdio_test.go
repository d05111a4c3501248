package mcpstdio

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

type wireReply struct {
	ID    json.RawMessage `json:"id"`
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, line string
		code       int    // 0: passed on to the SDK
		id         string // the id of the error response
	}{
		{"request", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, 0, ""},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, 0, ""},
		{"response to the server", `{"jsonrpc":"2.0","id":"s-1","result":{}}`, 0, ""},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"x"}]`, 0, ""},
		{"not JSON", `this is not json`, jsonrpc.CodeParseError, "null"},
		{"truncated", `{"jsonrpc":"2.0","id":1,"method":"pi`, jsonrpc.CodeParseError, "null"},
		{"two values", `{"jsonrpc":"2.0","id":1,"method":"ping"}{}`, jsonrpc.CodeParseError, "null"},
		{"scalar", `42`, jsonrpc.CodeInvalidRequest, "null"},
		{"wrong version, id kept", `{"jsonrpc":"1.0","id":7,"method":"ping"}`, jsonrpc.CodeInvalidRequest, "7"},
		{"no method, no id", `{"jsonrpc":"2.0"}`, jsonrpc.CodeInvalidRequest, "null"},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, jsonrpc.CodeInvalidRequest, "null"},
		{"empty batch", `[]`, jsonrpc.CodeInvalidRequest, "null"},
		{"bad batch item", `[{"jsonrpc":"2.0","id":1,"method":"ping"},3]`, jsonrpc.CodeInvalidRequest, "null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp := Check([]byte(tt.line))
			if tt.code == 0 {
				if resp != nil {
					t.Fatalf("Check(%s) = %s, want it passed on", tt.line, resp)
				}
				return
			}
			var r wireReply
			if err := json.Unmarshal(resp, &r); err != nil {
				t.Fatalf("Check(%s) = %q, not JSON: %v", tt.line, resp, err)
			}
			if r.Error.Code != tt.code || string(r.ID) != tt.id || r.Error.Message == "" {
				t.Errorf("Check(%s) = %s, want code %d and id %s", tt.line, resp, tt.code, tt.id)
			}
		})
	}
}

// The filter passes good lines through whole, answers the others on out, and
// goes on to the next line; an overlong line is answered, not fatal.
func TestFilter(t *testing.T) {
	t.Parallel()
	good1 := `{"jsonrpc":"2.0","id":1,"method":"ping"}`
	good2 := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	good3 := `{"jsonrpc":"2.0","id":3,"method":"ping"}` // no final newline
	input := good1 + "\r\n\n   \nnot json\n" + `{"long":"` + strings.Repeat("x", 200) + `"}` + "\n" + good2 + "\n{}\n" + good3
	var out bytes.Buffer
	tr := NewTransport(io.NopCloser(strings.NewReader(input)), nopWriteCloser{&out}, slog.New(slog.DiscardHandler))
	tr.Reader.(*filter).maxLine = 100
	got, err := io.ReadAll(tr.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if want := good1 + "\n" + good2 + "\n" + good3 + "\n"; string(got) != want {
		t.Errorf("passed on %q, want %q", got, want)
	}
	var codes []int
	for line := range bytes.Lines(out.Bytes()) {
		var r wireReply
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("answer %q: %v", line, err)
		}
		codes = append(codes, r.Error.Code)
	}
	want := []int{jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeInvalidRequest}
	if len(codes) != len(want) || codes[0] != want[0] || codes[1] != want[1] || codes[2] != want[2] {
		t.Errorf("answers %v, want %v", codes, want)
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// FuzzCheck: Check never panics; what it passes on the SDK can decode, and
// what it answers is a JSON-RPC error response.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`not json`, `{"jsonrpc":"1.0","id":"x","method":"ping"}`, `[]`, `null`, `{"id":1e400}`, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		resp := Check(line)
		if resp == nil {
			var raws []json.RawMessage
			if json.Unmarshal(line, &raws) != nil {
				raws = []json.RawMessage{line}
			}
			for _, raw := range raws {
				if _, err := jsonrpc.DecodeMessage(raw); err != nil {
					t.Fatalf("passed on %q, which the SDK rejects: %v", line, err)
				}
			}
			return
		}
		var r wireReply
		if err := json.Unmarshal(resp, &r); err != nil || (r.Error.Code != jsonrpc.CodeParseError && r.Error.Code != jsonrpc.CodeInvalidRequest) {
			t.Fatalf("answer to %q = %q (%v)", line, resp, err)
		}
	})
}
