package mcpstdio

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/conclave-ai/conclave/pkg/testenv"
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
	// Notifications: no answer is owed, so the input's end ends the reads.
	good1 := `{"jsonrpc":"2.0","method":"notifications/one"}`
	good2 := `{"jsonrpc":"2.0","method":"notifications/two"}`
	good3 := `{"jsonrpc":"2.0","method":"notifications/three"}` // no final newline
	input := good1 + "\r\n\n   \nnot json\n" + `{"long":"` + strings.Repeat("x", 200) + `"}` + "\n" + good2 + "\n{}\n" + good3
	var out bytes.Buffer
	tr := NewTransport(io.NopCloser(strings.NewReader(input)), nopWriteCloser{&out}, slog.New(slog.DiscardHandler))
	testenv.As[*filter](t, tr.Reader, "the transport's reader").maxLine = 100
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

// syncBuffer is a bytes.Buffer the SDK and the filter may write at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Close() error { return nil }

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// A client that writes its requests and closes its input, as `printf ... |
// conclave bridge mcp` does, gets every answer: the session ends only once
// the SDK has answered each request read. A handler that asks the client
// something meanwhile is told the client is gone, rather than waiting for
// an answer that cannot come.
func TestEndOfInputWaitsForAnswers(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "wait", InputSchema: &jsonschema.Schema{Type: "object"}}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		close(started)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "released"}}}, nil
	})
	s.AddTool(&mcp.Tool{Name: "ask", InputSchema: &jsonschema.Schema{Type: "object"}}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		err := req.Session.Ping(ctx, nil)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("ping: %v", err)}}}, nil
	})
	input := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipe","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"wait","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ask","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/list"}`,
	}, "\n") + "\n"
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- s.Run(ctx, NewTransport(io.NopCloser(strings.NewReader(input)), out, slog.New(slog.DiscardHandler)))
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the session ended (%v) before the wait tool started; wrote:\n%s", err, out.Bytes())
	case <-ctx.Done():
		t.Fatal("the wait tool never started")
	}
	close(release)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("the session did not end after its input did; wrote:\n%s", out.Bytes())
	}
	answers := map[string]string{} // id: the first text content, or the error
	for line := range bytes.Lines(out.Bytes()) {
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Result struct {
				Content []struct{ Text string } `json:"content"`
				Tools   []struct{ Name string } `json:"tools"`
			} `json:"result"`
			Error *struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("frame %q: %v", line, err)
		}
		switch {
		case m.Method != "":
			continue // the server's own request (ping)
		case m.Error != nil:
			answers[string(m.ID)] = "error: " + m.Error.Message
		case len(m.Result.Content) > 0:
			answers[string(m.ID)] = m.Result.Content[0].Text
		case len(m.Result.Tools) > 0:
			answers[string(m.ID)] = fmt.Sprintf("%d tools", len(m.Result.Tools))
		default:
			answers[string(m.ID)] = "result"
		}
	}
	want := map[string]string{"1": "result", "2": "released", "4": "2 tools"}
	for id, w := range want {
		if answers[id] != w {
			t.Errorf("answer to %s = %q, want %q (all: %v)", id, answers[id], w, answers)
		}
	}
	if !strings.Contains(answers["3"], "closed its input") {
		t.Errorf("answer to 3 = %q, want the server's ping failed because the client closed its input", answers["3"])
	}
}
