package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

func TestParseSendArgs(t *testing.T) {
	t.Parallel()
	vars := env(map[string]string{"CONCLAVE_TOKEN": "from-env", "USER": "ada"})
	tests := []struct {
		name string
		args []string
		want sendOptions
	}{
		{"flags first", []string{"--agent", "a1", "hello there"},
			sendOptions{gatewayFlags: gatewayFlags{"localhost:50051", "from-env"}, agentID: "a1", sender: "ada", message: "hello there"}},
		{"flags anywhere, words joined", []string{"hello", "--agent=a1", "there", "--addr", "gw:1", "--token", "t", "--thread", "th", "--sender", "bob", "--save-dir", "out"},
			sendOptions{gatewayFlags: gatewayFlags{"gw:1", "t"}, agentID: "a1", thread: "th", sender: "bob", saveDir: "out", message: "hello there"}},
		{"after -- everything is the message", []string{"--agent", "a1", "--", "--not-a-flag", "-x"},
			sendOptions{gatewayFlags: gatewayFlags{"localhost:50051", "from-env"}, agentID: "a1", sender: "ada", message: "--not-a-flag -x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseSendArgs(tt.args, vars, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseSendArgsRejects(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"hello"}, "--agent is required"},
		{[]string{"--agent", "a1"}, "a message is required"},
		{[]string{"--agent", "a1", " "}, "a message is required"},
		{[]string{"--agent", "a1", "--bogus", "hi"}, "bogus"},
	} {
		if _, err := parseSendArgs(tt.args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseSendArgs(%q) = %v, want %q", tt.args, err, tt.want)
		}
	}
	var usage bytes.Buffer
	if _, err := parseSendArgs([]string{"-h"}, env(nil), &usage); !errors.Is(err, flag.ErrHelp) || !strings.Contains(usage.String(), "--agent ID") {
		t.Errorf("-h = %v, usage %q", err, usage.String())
	}
}

func TestParseListArgs(t *testing.T) {
	t.Parallel()
	got, err := parseListArgs([]string{"--capability", "code", "--addr=gw:1"}, env(nil), io.Discard)
	if err != nil || got != (listOptions{gatewayFlags: gatewayFlags{addr: "gw:1"}, capability: "code"}) {
		t.Errorf("got %+v, %v", got, err)
	}
	if _, err := parseListArgs([]string{"extra"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("stray argument: %v", err)
	}
}

func TestRunAgentCommands(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if err := runAgent(context.Background(), []string{"help"}, &stdout, &stderr); err != nil || !strings.Contains(stdout.String(), "send") {
		t.Errorf("help: %v, %q", err, stdout.String())
	}
	if err := runAgent(context.Background(), nil, &stdout, &stderr); err == nil {
		t.Error("no command: want an error")
	}
	if err := runAgent(context.Background(), []string{"dance"}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), `"dance"`) {
		t.Errorf("unknown command: %v", err)
	}
}

// reply is the example agent's reply to "hi there", as the gateway relays it.
func reply(end *covenpb.MessageResponse) []*covenpb.MessageResponse {
	ev := func(e any) *covenpb.MessageResponse {
		r := &covenpb.MessageResponse{RequestId: "r1"}
		switch e := e.(type) {
		case *covenpb.MessageResponse_Thinking:
			r.Event = e
		case *covenpb.MessageResponse_Text:
			r.Event = e
		case *covenpb.MessageResponse_ToolUse:
			r.Event = e
		case *covenpb.MessageResponse_ToolResult:
			r.Event = e
		case *covenpb.MessageResponse_File:
			r.Event = e
		}
		return r
	}
	return []*covenpb.MessageResponse{
		ev(&covenpb.MessageResponse_Thinking{Thinking: "Reading a message from ada"}),
		ev(&covenpb.MessageResponse_Text{Text: "You said: "}),
		ev(&covenpb.MessageResponse_Text{Text: "hi there"}),
		ev(&covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{Id: "t1", Name: "clock", InputJson: `{"timezone":"UTC"}`}}),
		ev(&covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{Id: "t1", Output: "2026-03-04T05:06:07Z"}}),
		ev(&covenpb.MessageResponse_Text{Text: "\nThe clock says 2026-03-04T05:06:07Z."}),
		ev(&covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "echo.txt", MimeType: "text/plain", Data: []byte("hi there\n")}}),
		end,
	}
}

// printAll feeds events to a printer and returns what it wrote, whether the
// reply ended, and the error it ended with.
func printAll(p *replyPrinter, events []*covenpb.MessageResponse) (out string, ended bool, err error) {
	var buf bytes.Buffer
	p.w = &buf
	for _, ev := range events {
		if ended, err = p.print(ev); ended || err != nil {
			break
		}
	}
	return buf.String(), ended, err
}

func TestReplyPrinterStreamsAReply(t *testing.T) {
	t.Parallel()
	done := &covenpb.MessageResponse{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "ignored: text was streamed"}}}
	out, ended, err := printAll(&replyPrinter{}, reply(done))
	if err != nil || !ended {
		t.Fatalf("ended = %v, err = %v", ended, err)
	}
	const want = `thinking: Reading a message from ada
You said: hi there
[tool] clock {"timezone":"UTC"}
[tool result] clock: 2026-03-04T05:06:07Z
The clock says 2026-03-04T05:06:07Z.
[file] echo.txt (text/plain, 9 B)
`
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
}

func TestReplyPrinterDimsThinkingOnATerminal(t *testing.T) {
	t.Parallel()
	out, _, _ := printAll(&replyPrinter{color: true}, reply(nil)[:1])
	if out != "\x1b[2mthinking: Reading a message from ada\x1b[0m\n" {
		t.Errorf("output = %q", out)
	}
}

func TestReplyPrinterEndings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		events  []*covenpb.MessageResponse
		wantOut string
		wantErr string
	}{
		{"done without streamed text prints the full response",
			[]*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "all at once"}}}},
			"all at once\n", ""},
		{"the agent's own blank lines are kept",
			[]*covenpb.MessageResponse{
				{Event: &covenpb.MessageResponse_Text{Text: "a\n"}},
				{Event: &covenpb.MessageResponse_Text{Text: "\nb"}},
				{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "a\n\nb"}}},
			},
			"a\n\nb\n", ""},
		{"error ends the line and fails",
			[]*covenpb.MessageResponse{
				{Event: &covenpb.MessageResponse_Text{Text: "partial"}},
				{Event: &covenpb.MessageResponse_Error{Error: "model overloaded"}},
			},
			"partial\n", "the agent failed: model overloaded"},
		{"cancelled fails with the reason",
			[]*covenpb.MessageResponse{{Event: &covenpb.MessageResponse_Cancelled{Cancelled: &covenpb.Cancelled{Reason: "user pressed stop"}}}},
			"", "cancelled: user pressed stop"},
		{"tool errors, states, sessions and usage get lines of their own",
			[]*covenpb.MessageResponse{
				{Event: &covenpb.MessageResponse_SessionInit{SessionInit: &covenpb.SessionInit{SessionId: "s1"}}},
				{Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{Id: "t", Name: "sh", InputJson: "{\n\"cmd\": \"ls\"\n}"}}},
				{Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{Id: "t", State: covenpb.ToolState_TOOL_STATE_RUNNING}}},
				{Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{Id: "t", Output: "permission denied", IsError: true}}},
				{Event: &covenpb.MessageResponse_Usage{Usage: &covenpb.TokenUsage{InputTokens: 12, OutputTokens: 34}}},
				{Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}},
			},
			"session: s1\n[tool] sh { (+2 more lines)\n[tool] sh: running\n[tool error] sh: permission denied\nusage: 12 tokens in, 34 out\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, ended, err := printAll(&replyPrinter{}, tt.events)
			if !ended {
				t.Error("the reply did not end")
			}
			if out != tt.wantOut {
				t.Errorf("output = %q, want %q", out, tt.wantOut)
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestReplyPrinterSavesFilesInsideSaveDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "out")
	events := []*covenpb.MessageResponse{
		{Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "../../escape.txt", Data: []byte("x")}}},
		{Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "..", Data: []byte("y")}}},
	}
	out, _, err := printAll(&replyPrinter{saveDir: dir}, events)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"escape.txt": "x", "file": "y"} {
		if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", name, b, err)
		}
		if !strings.Contains(out, "saved to "+filepath.Join(dir, name)) {
			t.Errorf("output does not say where %s went:\n%s", name, out)
		}
	}
}

func TestOneLineAndByteSize(t *testing.T) {
	t.Parallel()
	if got := oneLine(strings.Repeat("é", 200)); len([]rune(got)) != 120 || !strings.HasSuffix(got, "…") {
		t.Errorf("long line = %q", got)
	}
	for n, want := range map[int]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 << 20: "3.0 MiB"} {
		if got := byteSize(n); got != want {
			t.Errorf("byteSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestPrintAgents(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	err := printAgents(&buf, []*gatewayv1.Agent{
		{AgentId: "a1", Name: "demo", Capabilities: []string{"chat", "code"}, ServerId: "dev"},
		{AgentId: "a2", ServerId: "gw-2", Busy: true, QueuedRequests: 2},
		{AgentId: "inst-1", Name: "example", ServerId: "gw-1", Metadata: &covenpb.AgentMetadata{Hostname: "runner-0", Workspaces: []string{"runner", "instance:inst-1"}}},
		{AgentId: "laptop", ServerId: "gw-1", Metadata: &covenpb.AgentMetadata{Hostname: "ada-laptop"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	const want = `ID      NAME     CAPABILITIES  RUNS ON          SERVER  BUSY
a1      demo     chat,code     -                dev     no
a2      -        -             -                gw-2    yes (+2 queued)
inst-1  example  -             runner:runner-0  gw-1    no
laptop  -        -             ada-laptop       gw-1    no
`
	if buf.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", buf.String(), want)
	}
	buf.Reset()
	if err := printAgents(&buf, nil); err != nil || buf.String() != "No agents are connected.\n" {
		t.Errorf("empty list: %q, %v", buf.String(), err)
	}
}

func TestRPCFailureIsOneClearLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{status.Error(codes.NotFound, `agent "a1" is not connected`), `agent "a1" is not connected to the gateway at gw:1; 'conclave agent list' shows which are`},
		{status.Error(codes.Unavailable, "connection refused"), "gateway gw:1 unavailable: connection refused"},
		{status.Error(codes.ResourceExhausted, "32 requests waiting"), `agent "a1" is too busy: 32 requests waiting`},
		{status.Error(codes.Unauthenticated, "bad token"), "gateway gw:1 refused the token (--token or $CONCLAVE_TOKEN): bad token"},
		{status.Error(codes.InvalidArgument, "content is too long"), "gateway gw:1: content is too long (InvalidArgument)"},
	}
	for _, tt := range tests {
		err := rpcFailure(context.Background(), tt.err, "gw:1", "a1")
		if err.Error() != tt.want {
			t.Errorf("got  %q\nwant %q", err, tt.want)
		}
		if status.Code(err) != status.Code(tt.err) {
			t.Errorf("%q lost its code %s", err, status.Code(tt.err))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rpcFailure(ctx, status.Error(codes.Canceled, "context canceled"), "gw:1", "a1"); !strings.HasPrefix(err.Error(), "interrupted") {
		t.Errorf("Ctrl-C: %v", err)
	}
}

// cancelOn is a writer that cancels a context once what was written to it
// contains a marker: a user pressing Ctrl-C halfway through a reply.
type cancelOn struct {
	testenv.LockedBuffer
	marker string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	n, err := c.LockedBuffer.Write(p)
	if strings.Contains(c.String(), c.marker) {
		c.cancel()
	}
	return n, err
}

func TestAgentCommandsAgainstConclaveDev(t *testing.T) {
	if testing.Short() {
		t.Skip("starts conclave dev and the example coven agent")
	}
	t.Parallel()
	agentBin := filepath.Join(t.TempDir(), "coven-agent")
	if err := testenv.GoBuild(t.Context(), agentBin, "./examples/coven-agent"); err != nil {
		t.Fatal(err)
	}
	_, addrs, _ := devProcess(t, t.TempDir())
	addr := addrs["gateway gRPC"]

	const id = "e2e-agent"
	var agentLog testenv.LockedBuffer
	ag := exec.Command(agentBin, "--addr", addr, "--agent-id", id, "--name", "e2e", "--capabilities", "chat,echo",
		"--step-delay", "50ms")
	ag.Stderr = &agentLog
	if err := ag.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ag.Process.Kill(); _ = ag.Wait() })

	agentCmd := func(ctx context.Context, stdout io.Writer, args ...string) (string, error) {
		var stderr bytes.Buffer
		err := runAgent(ctx, append(args, "--addr", addr), stdout, &stderr)
		return stderr.String(), err
	}
	var list bytes.Buffer
	testenv.EventuallyNoError(t, time.Minute, "the agent in 'conclave agent list'", func() error {
		list.Reset()
		_, err := agentCmd(context.Background(), &list, "list")
		if err == nil && !strings.Contains(list.String(), id) {
			err = fmt.Errorf("not listed")
		}
		if err != nil {
			return fmt.Errorf("%w\n%s\nagent log:\n%s", err, list.String(), agentLog.String())
		}
		return nil
	})
	if !strings.Contains(list.String(), "e2e") || !strings.Contains(list.String(), "chat,echo") {
		t.Errorf("list:\n%s", list.String())
	}

	t.Run("send streams the reply", func(t *testing.T) {
		var out bytes.Buffer
		saveDir := t.TempDir()
		if stderr, err := agentCmd(context.Background(), &out, "send", "--agent", id, "--save-dir", saveDir, "hello", "there"); err != nil {
			t.Fatalf("send: %v\n%s", err, stderr)
		}
		for _, want := range []string{"thinking: ", "You said: hello there", "[tool] clock", "[tool result] clock: ", "[file] echo.txt (text/plain, 12 B) saved to"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
		if !strings.HasSuffix(out.String(), ".\n"+"[file] echo.txt (text/plain, 12 B) saved to "+filepath.Join(saveDir, "echo.txt")+"\n") {
			t.Errorf("output should end with the file line:\n%s", out.String())
		}
		if b, err := os.ReadFile(filepath.Join(saveDir, "echo.txt")); err != nil || string(b) != "hello there\n" {
			t.Errorf("saved file: %q, %v", b, err)
		}
	})

	t.Run("threads and history show a conversation", func(t *testing.T) {
		stderr, err := agentCmd(context.Background(), io.Discard, "send", "--agent", id, "--sender", "ada", "first words")
		if err != nil {
			t.Fatalf("send: %v\n%s", err, stderr)
		}
		thread, _, ok := strings.Cut(strings.TrimPrefix(stderr, "thread "), " ")
		if !ok || !strings.HasPrefix(stderr, "thread ") || !strings.Contains(stderr, "--thread "+thread) {
			t.Fatalf("send did not name its new thread on stderr: %q", stderr)
		}
		if stderr, err := agentCmd(context.Background(), io.Discard, "send", "--agent", id, "--sender", "ada", "--thread", thread, "more words"); err != nil || strings.Contains(stderr, "thread ") {
			t.Fatalf("send in the thread: %v, stderr %q (a named thread is not announced)", err, stderr)
		}

		var threads bytes.Buffer
		if _, err := agentCmd(context.Background(), &threads, "threads", id); err != nil {
			t.Fatalf("threads: %v", err)
		}
		lines := strings.Split(strings.TrimSpace(threads.String()), "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[0], "THREAD") || !strings.HasPrefix(lines[1], thread+" ") {
			t.Errorf("threads should list %s first, newest first:\n%s", thread, threads.String())
		}

		var hist bytes.Buffer
		if _, err := agentCmd(context.Background(), &hist, "history", thread); err != nil {
			t.Fatalf("history: %v", err)
		}
		out := hist.String()
		first, second := strings.Index(out, "\nfirst words\n"), strings.Index(out, "\nmore words\n")
		if first < 0 || second < first || strings.Count(out, "── ada → "+id+" · ") != 2 || strings.Count(out, "── "+id+"\n") != 2 {
			t.Errorf("history should show both messages in order, each answered:\n%s", out)
		}
		for _, want := range []string{"You said: first words", "You said: more words", "[file] echo.txt (text/plain, 12 B; not kept)"} {
			if !strings.Contains(out, want) {
				t.Errorf("history lacks %q:\n%s", want, out)
			}
		}

		_, err = agentCmd(context.Background(), io.Discard, "history", "no-such-thread")
		if err == nil || !strings.HasPrefix(err.Error(), `thread "no-such-thread" not found`) || status.Code(err) != codes.NotFound {
			t.Errorf("an unknown thread: %v, want NotFound told plainly", err)
		}
	})

	t.Run("an unknown agent is one clear error", func(t *testing.T) {
		_, err := agentCmd(context.Background(), io.Discard, "send", "--agent", "nobody", "hi")
		if err == nil || !strings.Contains(err.Error(), `agent "nobody" is not connected`) || status.Code(err) != codes.NotFound {
			t.Fatalf("err = %v, want NotFound told plainly", err)
		}
	})

	t.Run("Ctrl-C cancels the request at the agent", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		out := &cancelOn{marker: "You said", cancel: cancel}
		_, err := agentCmd(ctx, out, "send", "--agent", id, "stop me halfway")
		if err == nil || !strings.HasPrefix(err.Error(), "interrupted") {
			t.Fatalf("err = %v, want interrupted", err)
		}
		testenv.EventuallyNoError(t, time.Minute, "the agent to be told to cancel", func() error {
			if log := agentLog.String(); !strings.Contains(log, `msg=cancelling`) {
				return fmt.Errorf("agent log:\n%s", log)
			}
			return nil
		})
		// The agent is free again for the next request.
		var next bytes.Buffer
		if stderr, err := agentCmd(context.Background(), &next, "send", "--agent", id, "again"); err != nil || !strings.Contains(next.String(), "You said: again") {
			t.Fatalf("send after cancel: %v\n%s%s", err, next.String(), stderr)
		}
	})
}

func TestAgentSendToAnUnreachableGateway(t *testing.T) {
	t.Parallel()
	err := runAgent(context.Background(), []string{"send", "--addr", "127.0.0.1:1", "--agent", "a", "hi"}, io.Discard, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "gateway 127.0.0.1:1 unavailable") || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("err = %v, want one line saying the gateway is unavailable", err)
	}
}
