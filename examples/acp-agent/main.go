// Command acp-agent is Conclave's example agent on stdio. It speaks the
// Agent Client Protocol of agentclientprotocol.com (-dialect acp), Kandev's
// dialect (-dialect kandev) or Kandev's legacy line format
// (-dialect legacy). A turn streams content, makes a tool call (writing
// notes.txt in the session's directory through fs/write_text_file, after
// asking permission), and ends (stopReason cancelled when its permission
// request is answered cancelled: the client cancelled the turn while it
// waited). -mode makes it misbehave, for the runner's failure tests:
//
//	normal         as above
//	slow-tool      the tool call waits until cancelled (or 60s)
//	ignore-cancel  like slow-tool, but ignores session/cancel
//	hang           never answers session/prompt, never ends the turn
//	hang-init      never answers initialize
//	hang-init-once never answers initialize the first time it runs in a
//	               directory (it leaves .acp-agent-hung there), then is normal
//	crash          exits with status 3 in the middle of a turn
//	junk           first writes lines the runner must survive: not JSON,
//	               not UTF-8, an oversized line, an update before
//	               initialize, a response to an unknown id
//	linger         does not exit when its stdin closes
//	deaf           stops reading its stdin after its first session/prompt
//	               (with -dialect kandev its turn still ends)
//	orphan         mid-turn, starts a process in a session of its own that
//	               keeps its stdout and stderr open, then exits with status 3
//	gated          a turn writes agent.pid in the session's directory, streams
//	               "Working on", waits for a file named release there (or a
//	               cancel), then streams -chunks chunks "chunk 1", "chunk 2", ...
//	               and ends; it writes streamed there once they are written
//	late-replay    session/load answers first and replays the history after
//	               the answer, as Gemini CLI does (against the ACP)
//
// In every other mode, session/load replays the session's history (an
// agent_message_chunk "replayed history of <id>", and the last turn's
// answer " Done.") before answering, as the ACP asks.
//
// -auth ID makes it offer one authMethods entry, ID, in initialize, and
// refuse session/new and session/load with the ACP's auth_required error
// (-32000) until the client has called authenticate with it.
//
// -flood N makes a turn stream N agent_message_chunk notifications as fast
// as it can, and nothing else, for the runner's benchmarks.
//
// -permission-path names the file its permission request says the tool
// call touches (its location; default notes.txt in the session's
// directory, the file it then writes): a path outside its workspace lets
// the runner's governance tests make the Librarian see a deviation.
//
// -mcp-url URL makes a turn call an MCP tool once its permission request
// is allowed: -mcp-tool with the arguments -mcp-args (a JSON object), on the
// server's streamable HTTP endpoint URL (the bridge's /mcp). It streams
// the tool's answer, reports it as the tool call's output, and writes it
// into notes.txt. The tool and its arguments are the operator's (the agent
// type's command), never the prompt's; ACP_AGENT_MCP_TOKEN, when set, is
// the server's bearer token.
//
// -print-env makes it write its environment to stderr at start, one
// "acp-agent: env NAME=VALUE" line each, for tests of what reaches it.
//
// -bus makes it also a bus agent (the bub protocol) when the runner launches it for
// the bus's default handler: it dials BUB_BUS_URL with BUB_TOKEN, subscribes
// to BUB_DEFAULT_TOPIC, and answers each processMessage, publishing a reply
// on agent:{BUB_AGENT_ID} first (bus.go).
//
// It logs to stderr, including the TRACEPARENT it was given, and puts a
// child of that trace in params._meta.traceparent of its notifications. A
// turn whose session/prompt carries params._meta.traceparent (a prompt the
// runner took from a gateway client) continues that trace instead, in its
// notifications, its requests and its MCP call.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

type agent struct {
	dialect, mode string
	flood, chunks int
	traceparent   string
	out           *bufio.Writer
	mu            sync.Mutex
	nextID        int
	pending       map[string]chan message
	cancel        chan struct{}
	cancelOnce    *sync.Once
	cwd           string
	sessionID     string
	// permissionPath is the location its permission request names ("":
	// notes.txt in cwd).
	permissionPath string
	// authMethod is -auth; authenticated is set once authenticate named it.
	authMethod    string
	authenticated bool
	// tool is -mcp-url's tool; its url is "" without one.
	tool mcpTool
}

func main() {
	dialect := flag.String("dialect", "acp", "acp, kandev or legacy")
	mode := flag.String("mode", "normal", "normal, slow-tool, ignore-cancel, hang, hang-init, hang-init-once, crash, junk, linger, deaf, orphan, gated or late-replay")
	flood := flag.Int("flood", 0, "stream this many chunks per turn and nothing else")
	chunks := flag.Int("chunks", 100, "the chunks a gated turn streams once released")
	printEnv := flag.Bool("print-env", false, "write the environment to stderr at start")
	bus := flag.Bool("bus", false, "also join the bus at BUB_BUS_URL as BUB_AGENT_ID and answer processMessage on BUB_DEFAULT_TOPIC")
	permissionPath := flag.String("permission-path", "", "the file its permission request names (default: notes.txt in the session's directory)")
	auth := flag.String("auth", "", "offer this authMethods id, and open no session until authenticate names it")
	mcpURL := flag.String("mcp-url", "", "after its permission request is allowed, a turn calls -mcp-tool on this MCP endpoint (streamable HTTP)")
	mcpName := flag.String("mcp-tool", "", "the MCP tool a turn calls (with -mcp-url)")
	mcpArgs := flag.String("mcp-args", "", "the MCP tool's arguments, a JSON object (with -mcp-url)")
	flag.Parse()
	toolArgs, err := parseArgs(*mcpArgs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "acp-agent:", err)
		os.Exit(2)
	}
	a := &agent{dialect: *dialect, mode: *mode, flood: *flood, chunks: *chunks, authMethod: *auth, out: bufio.NewWriterSize(os.Stdout, 64<<10), pending: map[string]chan message{},
		permissionPath: *permissionPath, tool: mcpTool{url: *mcpURL, name: *mcpName, args: toolArgs, token: os.Getenv("ACP_AGENT_MCP_TOKEN")}}
	if *printEnv {
		for _, kv := range os.Environ() {
			fmt.Fprintln(os.Stderr, "acp-agent: env", kv)
		}
	}
	if tp := os.Getenv("TRACEPARENT"); tp != "" {
		a.traceparent = childTraceparent(tp)
		fmt.Fprintln(os.Stderr, "acp-agent: TRACEPARENT", tp)
	}
	fmt.Fprintf(os.Stderr, "acp-agent: dialect %s, mode %s\n", *dialect, *mode)
	if *bus {
		go func() {
			if err := joinBus(context.Background()); err != nil {
				fmt.Fprintln(os.Stderr, "acp-agent: bus:", err)
			}
		}()
	}
	if *mode == "junk" {
		a.junk()
	}
	if *dialect == "legacy" {
		a.legacy()
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var m message
		if err := json.Unmarshal(in.Bytes(), &m); err != nil {
			fmt.Fprintln(os.Stderr, "acp-agent: bad line:", err)
			continue
		}
		switch {
		case m.Method == "" && m.ID != nil:
			a.mu.Lock()
			ch := a.pending[string(m.ID)]
			delete(a.pending, string(m.ID))
			a.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case m.Method != "":
			a.handle(m)
		}
		if a.mode == "deaf" && m.Method == "session/prompt" {
			fmt.Fprintln(os.Stderr, "acp-agent: no longer reading stdin, on purpose")
			sleepForever()
		}
	}
	if a.mode == "linger" {
		fmt.Fprintln(os.Stderr, "acp-agent: stdin closed; lingering on purpose")
		sleepForever()
	}
	fmt.Fprintln(os.Stderr, "acp-agent: stdin closed; exiting")
}

// sleepForever blocks without looking deadlocked to the runtime (a bare
// select{} with no other goroutine is a fatal "all goroutines are asleep").
func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

// childTraceparent keeps the trace id of tp and makes a new span id.
func childTraceparent(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		return ""
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return parts[0] + "-" + parts[1] + "-" + hex.EncodeToString(b[:]) + "-" + parts[3]
}

func (a *agent) write(v any) {
	data, _ := json.Marshal(v)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.out.Write(data)
	a.out.WriteByte('\n')
	a.out.Flush()
}

func (a *agent) respond(id json.RawMessage, result any) {
	a.write(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
}

func (a *agent) respondError(id json.RawMessage, code int, msg string) {
	a.write(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
}

func (a *agent) notify(method string, params map[string]any) {
	if a.traceparent != "" {
		params["_meta"] = map[string]any{"traceparent": a.traceparent}
	}
	a.write(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
}

// call sends a request to the client and waits for its response.
func (a *agent) call(method string, params any) message {
	a.mu.Lock()
	a.nextID++
	id := fmt.Sprintf("%d", 1000+a.nextID)
	ch := make(chan message, 1)
	a.pending[id] = ch
	a.mu.Unlock()
	if p, ok := params.(map[string]any); ok && a.traceparent != "" {
		p["_meta"] = map[string]any{"traceparent": a.traceparent}
	}
	a.write(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(id), "method": method, "params": params})
	return <-ch
}

func (a *agent) handle(m message) {
	switch m.Method {
	case "initialize":
		if a.mode == "hang-init" {
			return
		}
		if a.mode == "hang-init-once" {
			if _, err := os.Stat(".acp-agent-hung"); err != nil {
				_ = os.WriteFile(".acp-agent-hung", nil, 0o644)
				return
			}
		}
		if a.dialect == "kandev" {
			a.respond(m.ID, map[string]any{"protocolVersion": "1.0", "serverInfo": map[string]string{"name": "conclave-acp-agent", "version": "1.0.0"},
				"capabilities": map[string]bool{"streaming": true, "sessionResumption": true}})
			return
		}
		result := map[string]any{"protocolVersion": 1, "agentCapabilities": map[string]any{"loadSession": true},
			"agentInfo": map[string]string{"name": "conclave-acp-agent", "version": "1.0.0"}}
		if a.authMethod != "" {
			result["authMethods"] = []map[string]string{{"id": a.authMethod, "name": "Test key", "description": "a key the agent already has"}}
		}
		a.respond(m.ID, result)
	case "authenticate":
		var p struct {
			MethodID string `json:"methodId"`
		}
		_ = json.Unmarshal(m.Params, &p)
		if a.authMethod == "" || p.MethodID != a.authMethod {
			a.respondError(m.ID, -32602, "Invalid params: unknown auth method "+p.MethodID)
			return
		}
		fmt.Fprintln(os.Stderr, "acp-agent: authenticated with", p.MethodID)
		a.authenticated = true
		a.respond(m.ID, map[string]any{})
	case "session/new", "session/load":
		if a.authMethod != "" && !a.authenticated {
			a.respondError(m.ID, -32000, "Authentication required: no API key is configured")
			return
		}
		var p struct {
			Cwd       string `json:"cwd"`
			SessionID string `json:"sessionId"`
		}
		_ = json.Unmarshal(m.Params, &p)
		a.cwd = p.Cwd
		if a.cwd == "" {
			a.cwd, _ = os.Getwd()
		}
		a.sessionID = p.SessionID
		if a.sessionID == "" {
			var b [8]byte
			_, _ = rand.Read(b[:])
			a.sessionID = "sess-" + hex.EncodeToString(b[:])
		}
		if m.Method == "session/load" {
			fmt.Fprintln(os.Stderr, "acp-agent: loaded session", a.sessionID)
			if a.mode == "late-replay" {
				a.respond(m.ID, map[string]any{"sessionId": a.sessionID, "loaded": true})
				a.replay()
				return
			}
			a.replay()
			a.respond(m.ID, map[string]any{"sessionId": a.sessionID, "loaded": true})
			return
		}
		a.respond(m.ID, map[string]any{"sessionId": a.sessionID})
	case "session/prompt":
		a.cancel, a.cancelOnce = make(chan struct{}), &sync.Once{}
		var p struct {
			Meta struct {
				Traceparent string `json:"traceparent"`
			} `json:"_meta"`
		}
		_ = json.Unmarshal(m.Params, &p)
		// Set before the turn's goroutine starts, which reads it.
		if tp := childTraceparent(p.Meta.Traceparent); tp != "" {
			a.traceparent = tp
			fmt.Fprintln(os.Stderr, "acp-agent: the turn continues trace", p.Meta.Traceparent)
		}
		go a.turn(m)
	case "session/cancel":
		fmt.Fprintln(os.Stderr, "acp-agent: session/cancel received")
		if a.mode == "ignore-cancel" {
			return
		}
		if a.dialect == "kandev" {
			// Kandev's agents clean up and exit on cancel.
			os.Exit(0)
		}
		if a.cancel != nil {
			a.cancelOnce.Do(func() { close(a.cancel) })
		}
	default:
		if m.ID != nil {
			a.respondError(m.ID, -32601, "Method not found: "+m.Method)
		}
	}
}

// replay streams the session's history, as a session/load does: the
// user's prompt, "replayed history of <id>", and the last turn's answer.
func (a *agent) replay() {
	for _, u := range []map[string]any{
		{"sessionUpdate": "user_message_chunk", "content": map[string]any{"type": "text", "text": "an earlier prompt"}},
		{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": "replayed history of " + a.sessionID}},
		{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": " Done."}},
	} {
		text := u["content"].(map[string]any)["text"].(string)
		if a.dialect == "kandev" && u["sessionUpdate"] == "user_message_chunk" {
			continue
		}
		a.update(u, "content", map[string]any{"text": text})
		if a.mode == "late-replay" {
			// Spread out, as an agent that streams it from disk.
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (a *agent) prompt(params json.RawMessage) string {
	var p struct {
		Message string `json:"message"`
		Prompt  []struct {
			Text string `json:"text"`
		} `json:"prompt"`
	}
	_ = json.Unmarshal(params, &p)
	if p.Message != "" {
		return p.Message
	}
	var parts []string
	for _, b := range p.Prompt {
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "")
}

func (a *agent) update(acpUpdate map[string]any, kandevType string, kandevData map[string]any) {
	if a.dialect == "kandev" {
		a.notify("session/update", map[string]any{"type": kandevType, "data": kandevData})
		return
	}
	a.notify("session/update", map[string]any{"sessionId": a.sessionID, "update": acpUpdate})
}

func (a *agent) turn(m message) {
	if a.flood > 0 {
		a.floodTurn(m)
		return
	}
	text := a.prompt(m.Params)
	if a.mode == "hang" {
		fmt.Fprintln(os.Stderr, "acp-agent: hanging on purpose")
		return
	}
	if a.dialect == "kandev" {
		a.respond(m.ID, map[string]any{"accepted": true})
	}
	a.update(map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": "Working on: " + text}},
		"content", map[string]any{"text": "Working on: " + text})
	if a.mode == "gated" {
		a.gatedTurn(m)
		return
	}
	if a.mode == "crash" {
		fmt.Fprintln(os.Stderr, "acp-agent: crashing on purpose")
		os.Exit(3)
	}
	if a.mode == "orphan" {
		orphan := exec.Command("/bin/sleep", "600")
		orphan.Stdout, orphan.Stderr = os.Stdout, os.Stderr
		orphan.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := orphan.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "acp-agent: starting the orphan:", err)
		} else {
			fmt.Fprintln(os.Stderr, "acp-agent: left orphan", orphan.Process.Pid, "holding stdout; exiting")
		}
		os.Exit(3)
	}
	a.update(map[string]any{"sessionUpdate": "plan", "entries": []map[string]any{
		{"content": "read the prompt", "priority": "high", "status": "completed"},
		{"content": "write notes.txt", "priority": "high", "status": "in_progress"}}},
		"progress", map[string]any{"text": "halfway", "progress": 50})
	a.update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": "call_1", "title": "write notes.txt", "kind": "edit", "status": "pending"},
		"toolCall", map[string]any{"toolName": "file_edit", "status": "running", "args": map[string]any{"file": "notes.txt"}})
	stop := "end_turn"
	switch a.mode {
	case "slow-tool", "ignore-cancel":
		select {
		case <-a.cancel:
			stop = "cancelled"
		case <-time.After(60 * time.Second):
		}
	}
	if stop == "end_turn" && a.dialect == "acp" {
		location := a.permissionPath
		if location == "" {
			location = filepath.Join(a.cwd, "notes.txt")
		}
		perm := a.call("session/request_permission", map[string]any{"sessionId": a.sessionID,
			"toolCall": map[string]any{"toolCallId": "call_1", "title": "write notes.txt", "kind": "edit", "status": "pending",
				"locations": []map[string]any{{"path": location}}},
			"options": []map[string]any{{"optionId": "allow", "name": "Allow", "kind": "allow_once"}, {"optionId": "reject", "name": "Reject", "kind": "reject_once"}}})
		var outcome struct {
			Outcome struct {
				Outcome  string `json:"outcome"`
				OptionID string `json:"optionId"`
			} `json:"outcome"`
		}
		_ = json.Unmarshal(perm.Result, &outcome)
		if outcome.Outcome.Outcome == "cancelled" {
			// The client answers so only once it cancelled the turn,
			// which then ends cancelled, as the ACP asks.
			stop = "cancelled"
		}
		status := "failed"
		if outcome.Outcome.OptionID == "allow" {
			notes := "notes on: " + text + "\n"
			if a.tool.url != "" {
				notes += a.callTool() + "\n"
			}
			res := a.call("fs/write_text_file", map[string]any{"sessionId": a.sessionID, "path": filepath.Join(a.cwd, "notes.txt"), "content": notes})
			if res.Error == nil {
				status = "completed"
			} else {
				fmt.Fprintln(os.Stderr, "acp-agent: fs/write_text_file failed:", string(res.Error))
			}
		}
		a.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "call_1", "status": status}, "", nil)
	}
	if stop == "cancelled" {
		a.respond(m.ID, map[string]any{"stopReason": "cancelled"})
		return
	}
	a.update(map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": " Done."}},
		"complete", map[string]any{"sessionId": a.sessionID, "success": true, "summary": "Done: " + text})
	if a.dialect == "acp" {
		a.respond(m.ID, map[string]any{"stopReason": "end_turn"})
	}
}

// legacy reports a whole run in Kandev's legacy line format and exits.
func (a *agent) legacy() {
	now := func() string { return time.Now().UTC().Format(time.RFC3339) }
	for _, l := range []map[string]any{
		{"type": "status", "data": map[string]any{"status": "started"}},
		{"type": "progress", "data": map[string]any{"percentage": 50, "current_file": "main.go"}},
		{"type": "log", "data": map[string]any{"level": "info", "message": "halfway there"}},
		{"type": "heartbeat", "data": map[string]any{}},
		{"type": "result", "data": map[string]any{"status": "completed", "summary": "legacy run done"}},
	} {
		l["timestamp"] = now()
		a.write(l)
	}
}

// junk writes what a misbehaving agent might.
func (a *agent) junk() {
	a.mu.Lock()
	a.out.WriteString("this is not JSON\n")
	a.out.Write([]byte{'{', '"', 0xff, 0xfe, '"', '}', '\n'})
	big := make([]byte, 10<<20)
	for i := range big {
		big[i] = 'x'
	}
	a.out.WriteString(`{"jsonrpc":"2.0","method":"session/update","params":{"pad":"`)
	a.out.Write(big)
	a.out.WriteString("\"}}\n")
	a.out.WriteString(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"early","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"too early"}}}}` + "\n")
	a.out.WriteString(`{"jsonrpc":"2.0","id":987654,"result":{}}` + "\n")
	a.out.WriteString(`{"jsonrpc":"2.0","method":"session/up`) // a partial line, completed by the next write
	a.out.WriteString("\n")
	a.out.Flush()
	a.mu.Unlock()
}

// floodTurn writes a.flood chunks through one buffer, flushed when full, so
// that the reader, not the writer, is what a benchmark measures.
func (a *agent) floodTurn(m message) {
	line := []byte(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + a.sessionID +
		`","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a chunk of streamed text, typical of a model's output"}}}}` + "\n")
	a.mu.Lock()
	for range a.flood {
		a.out.Write(line)
	}
	a.out.Flush()
	a.mu.Unlock()
	a.respond(m.ID, map[string]any{"stopReason": "end_turn"})
}

// gatedTurn waits for the test to release it, then streams a.chunks chunks.
func (a *agent) gatedTurn(m message) {
	_ = os.WriteFile(filepath.Join(a.cwd, "agent.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644)
	for {
		if _, err := os.Stat(filepath.Join(a.cwd, "release")); err == nil {
			break
		}
		select {
		case <-a.cancel:
			a.respond(m.ID, map[string]any{"stopReason": "cancelled"})
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	for i := 1; i <= a.chunks; i++ {
		text := fmt.Sprintf("chunk %d", i)
		a.update(map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}},
			"content", map[string]any{"text": text})
	}
	_ = os.WriteFile(filepath.Join(a.cwd, "streamed"), nil, 0o644)
	if a.dialect == "kandev" {
		a.update(nil, "complete", map[string]any{"sessionId": a.sessionID, "success": true, "summary": "streamed"})
		return
	}
	a.respond(m.ID, map[string]any{"stopReason": "end_turn"})
}

// callTool calls -mcp-url's tool as a tool call of its own (call_2), and
// streams and returns its answer (or the error, as the call's output).
func (a *agent) callTool() string {
	a.update(map[string]any{"sessionUpdate": "tool_call", "toolCallId": "call_2", "title": a.tool.name, "kind": "fetch", "status": "in_progress",
		"rawInput": a.tool.args}, "", nil)
	out, err := a.tool.call(context.Background(), a.traceparent)
	status := "completed"
	if err != nil {
		fmt.Fprintln(os.Stderr, "acp-agent: MCP:", err)
		out, status = err.Error(), "failed"
	}
	a.update(map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": "call_2", "status": status,
		"content": []map[string]any{{"type": "content", "content": map[string]any{"type": "text", "text": out}}}}, "", nil)
	a.update(map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": " " + a.tool.name + ": " + out}},
		"content", map[string]any{"text": " " + a.tool.name + ": " + out})
	return out
}
