package acp

import (
	"bytes"
	"context"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
)

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// recorder collects what a client reports.
type recorder struct {
	mu      sync.Mutex
	updates []Update
	drops   []string
}

func (r *recorder) opts(dialect string) Options {
	return Options{
		Dialect:  dialect,
		OnUpdate: func(_ context.Context, u Update) { r.mu.Lock(); r.updates = append(r.updates, u); r.mu.Unlock() },
		OnDrop:   func(reason string) { r.mu.Lock(); r.drops = append(r.drops, reason); r.mu.Unlock() },
		MaxLine:  1 << 20,
	}
}

// run feeds input to a client as the agent's stdout and waits for the end.
func run(t testing.TB, input string, o Options, initialized bool) *Client {
	// The input goes in only once the client's state is set: its read loop
	// starts in New.
	pr, pw := io.Pipe()
	c := New(pr, nopWriteCloser{io.Discard}, o)
	c.initialized.Store(initialized)
	go func() {
		_, _ = io.Copy(pw, strings.NewReader(input))
		_ = pw.Close()
	}()
	<-c.Done()
	return c
}

func TestBadLines(t *testing.T) {
	t.Parallel()
	big := `{"jsonrpc":"2.0","method":"session/update","params":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`
	for _, tt := range []struct {
		name        string
		input       string
		initialized bool
		drops       []string
		updates     int
	}{
		{"not JSON", "hello\n", true, []string{DropNotJSON}, 0},
		{"not UTF-8", "{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"type\":\"content\",\"data\":{\"text\":\"\xff\"}}}\n", true, []string{DropNotUTF8}, 0},
		{"a line over the limit, then a good one", big + "\n" + `{"jsonrpc":"2.0","method":"session/update","params":{"type":"content","data":{"text":"ok"}}}` + "\n", true, []string{DropTooLong}, 1},
		{"an update before initialize", `{"jsonrpc":"2.0","method":"session/update","params":{"type":"content","data":{"text":"early"}}}` + "\n", false, []string{DropEarly}, 0},
		{"an update without a type", `{"jsonrpc":"2.0","method":"session/update","params":{"data":{}}}` + "\n", true, []string{DropBadUpdate}, 0},
		{"a response to an unknown id", `{"jsonrpc":"2.0","id":42,"result":{}}` + "\n", true, []string{DropUnknownResponse}, 0},
		{"a partial last line", `{"jsonrpc":"2.0","method":"session/upd`, true, nil, 0},
		{"legacy lines", `{"type":"progress","data":{"percentage":40}}` + "\n" + `{"type":"bogus"}` + "\n", true, []string{DropUnknownType}, 1},
		{"a legacy line whose data says jsonrpc", `{"type":"log","data":{"message":"jsonrpc"}}` + "\n" + `{"type":"log","data":{"jsonrpc":"2.0","message":"x"}}` + "\n", true, nil, 2},
		{"a response to an unknown id whose result has a method", `{"jsonrpc":"2.0","id":42,"result":{"method":"x"}}` + "\n", true, []string{DropUnknownResponse}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var r recorder
			run(t, tt.input, r.opts(DialectKandev), tt.initialized)
			if strings.Join(r.drops, ",") != strings.Join(tt.drops, ",") || len(r.updates) != tt.updates {
				t.Fatalf("drops %v, updates %d; want %v, %d", r.drops, len(r.updates), tt.drops, tt.updates)
			}
		})
	}
}

func TestDecodeUpdates(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		dialect, params string
		want            Update
	}{
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}`, Update{Kind: KindContent, Text: "hi", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c1","title":"Edit","status":"pending"}}`, Update{Kind: KindToolCall, ToolCallID: "c1", ToolName: "Edit", ToolStatus: "pending", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[{"content":"read","status":"completed"},{"content":"write","status":"pending"}]}}`, Update{Kind: KindPlan, Text: "1/2 completed: read [completed]; write [pending]", Progress: 50}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"plan","entries":[]}}`, Update{Kind: KindPlan, Progress: -1}},
		// The other updates of the ACP, named (an agent sends them between
		// turns, and a session/load replays them).
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"memory","description":"Manage memory."},{"name":"init","input":null}]}}`, Update{Kind: KindAvailableCommands, Text: "memory, init", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"current_mode_update","currentModeId":"autoEdit"}}`, Update{Kind: KindCurrentMode, Text: "autoEdit", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"fix it"}}}`, Update{Kind: KindUserMessage, Text: "fix it", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"session_info_update","title":"Fixing it"}}`, Update{Kind: KindSessionInfo, Text: "Fixing it", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"usage_update","used":1200,"size":200000}}`, Update{Kind: KindUsage, Text: "1200 of 200000 tokens", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"config_option_update","configOptions":[]}}`, Update{Kind: KindConfigOption, Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"a_future_update","x":1}}`, Update{Kind: KindOther, Text: "a_future_update", Progress: -1}},
		{DialectACP, `{"sessionId":"s","update":{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"` + strings.Repeat("x", 600) + `"}]}}`, Update{Kind: KindAvailableCommands, Text: strings.Repeat("x", maxSummary) + "…", Progress: -1}},
		{DialectKandev, `{"type":"complete","data":{"sessionId":"abc","success":true,"summary":"done"}}`, Update{Kind: KindComplete, Success: true, SessionID: "abc", Text: "done", Progress: 100}},
		{DialectKandev, `{"type":"error","data":{"message":"bad","details":"line 45"}}`, Update{Kind: KindError, Text: "bad line 45", Progress: -1}},
	} {
		var (
			got Update
			err error
		)
		if tt.dialect == DialectACP {
			got, err = decodeACP([]byte(tt.params))
		} else {
			got, err = decodeKandev([]byte(tt.params))
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %+v, %v; want %+v", tt.params, got, err, tt.want)
		}
	}
}

// FuzzLineDecoder feeds arbitrary agent output through the line filter, the
// JSON-RPC connection and both dialects' update decoders: nothing may panic
// or hang, and the client must end when the output does.
func FuzzLineDecoder(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hi"}}}}` + "\n",
		`{"jsonrpc":"2.0","method":"session/update","params":{"type":"toolCall","data":{"toolName":"x","args":{}}}}` + "\n",
		`{"type":"result","data":{"status":"completed"}}` + "\n",
		`{"type":"progress","data":{"percentage":"x"}}` + "\n",
		"not json\n\xff\xfe\n",
		`[{"jsonrpc":"2.0","id":1,"result":{}}]` + "\n",
		`{"jsonrpc":"2.0","id":"a","method":"fs/read_text_file","params":{"path":"/etc/passwd"}}` + "\n",
		`{"jsonrpc":"2.0","id":2,"method":"session/request_permission","params":{"options":[{"optionId":"a","kind":"allow_once","name":"A"}]}}` + "\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, dialect := range []string{DialectACP, DialectKandev} {
			var out bytes.Buffer
			var r recorder
			o := r.opts(dialect)
			o.MaxLine = 4096
			c := New(bytes.NewReader(data), nopWriteCloser{&out}, o)
			c.initialized.Store(true)
			<-c.Done()
		}
	})
}
