package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

const agentUsage = `Usage: conclave agent <command> [flags]

Commands:
  send     send a message to an agent and stream its reply
  list     list the connected agents
  threads  list an agent's conversation threads, newest first
  history  print a thread's conversation
  swarm    hold many idle agents on the gateway, for load tests

Run 'conclave agent <command> -h' for a command's flags.
`

// runAgent is `conclave agent`: a client of the gateway's GatewayService.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, agentUsage)
		return errors.New("agent: no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "send":
		opts, err := parseSendArgs(rest, os.LookupEnv, stderr)
		if err != nil {
			return err
		}
		return agentSend(ctx, opts, stdout, stderr)
	case "threads":
		opts, err := parseThreadsArgs(rest, os.LookupEnv, stderr)
		if err != nil {
			return err
		}
		return agentThreads(ctx, opts, stdout)
	case "history":
		opts, err := parseHistoryArgs(rest, os.LookupEnv, stderr)
		if err != nil {
			return err
		}
		return agentHistory(ctx, opts, stdout)
	case "list":
		opts, err := parseListArgs(rest, os.LookupEnv, stderr)
		if err != nil {
			return err
		}
		return agentList(ctx, opts, stdout)
	case "swarm":
		opts, err := parseSwarmArgs(rest, stderr)
		if err != nil {
			return err
		}
		return runSwarm(ctx, opts, os.Stdin, stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, agentUsage)
		return nil
	default:
		fmt.Fprint(stderr, agentUsage)
		return fmt.Errorf("agent: unknown command %q", cmd)
	}
}

// gatewayFlags say how to reach the gateway; every agent command has them.
type gatewayFlags struct {
	addr  string
	token string
}

func (g *gatewayFlags) register(fs *flag.FlagSet, lookup func(string) (string, bool)) {
	token, _ := lookup("CONCLAVE_TOKEN")
	fs.StringVar(&g.addr, "addr", "localhost:50051", "the gateway's gRPC address")
	fs.StringVar(&g.token, "token", token, "bearer token for the gateway (default $CONCLAVE_TOKEN)")
}

// dial connects to the gateway and returns a context that carries the token.
func (g gatewayFlags) dial(ctx context.Context) (context.Context, gatewayv1.GatewayServiceClient, io.Closer, error) {
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("gateway address %q: %w", g.addr, err)
	}
	if g.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.token)
	}
	return ctx, gatewayv1.NewGatewayServiceClient(conn), conn, nil
}

type sendOptions struct {
	gatewayFlags
	agentID string
	thread  string
	sender  string
	message string
	saveDir string
}

func parseSendArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (sendOptions, error) {
	var o sendOptions
	fs := flag.NewFlagSet("conclave agent send", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `Usage: conclave agent send --agent ID [flags] "message"`)
		fs.PrintDefaults()
	}
	o.register(fs, lookup)
	user, _ := lookup("USER")
	fs.StringVar(&o.agentID, "agent", "", "the agent to send to (required)")
	fs.StringVar(&o.thread, "thread", "", "conversation thread ID")
	fs.StringVar(&o.sender, "sender", user, "who the message is from (default $USER)")
	fs.StringVar(&o.saveDir, "save-dir", "", "save the files the agent sends into this directory")
	words, err := parseInterleaved(fs, args)
	if err != nil {
		return sendOptions{}, err
	}
	o.message = strings.Join(words, " ")
	switch {
	case o.agentID == "":
		return sendOptions{}, errors.New("agent send: --agent is required")
	case strings.TrimSpace(o.message) == "":
		return sendOptions{}, errors.New("agent send: a message is required")
	}
	return o, nil
}

type listOptions struct {
	gatewayFlags
	capability string
}

func parseListArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (listOptions, error) {
	var o listOptions
	fs := flag.NewFlagSet("conclave agent list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs, lookup)
	fs.StringVar(&o.capability, "capability", "", "only agents with this capability")
	rest, err := parseInterleaved(fs, args)
	if err != nil {
		return listOptions{}, err
	}
	if len(rest) > 0 {
		return listOptions{}, fmt.Errorf("agent list: unexpected argument %q", rest[0])
	}
	return o, nil
}

func agentSend(ctx context.Context, o sendOptions, stdout, stderr io.Writer) error {
	callCtx, client, conn, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := client.SendMessage(callCtx, &gatewayv1.SendMessageRequest{
		AgentId: o.agentID, ThreadId: o.thread, Sender: o.sender, Content: o.message,
	})
	if err != nil {
		return rpcFailure(ctx, err, o.addr, o.agentID)
	}
	p := &replyPrinter{w: stdout, color: colorful(stdout), saveDir: o.saveDir}
	requestID := ""
	for {
		resp, err := stream.Recv()
		if err != nil {
			p.endLine()
			if errors.Is(err, io.EOF) {
				return errors.New("the gateway ended the reply before the agent finished it")
			}
			if ctx.Err() != nil && requestID != "" {
				// Ctrl-C: a gateway that keeps history lets a request
				// outlive its client, so it is told to stop.
				cancelRequest(callCtx, client, requestID)
			}
			return rpcFailure(ctx, err, o.addr, o.agentID)
		}
		if requestID == "" {
			requestID = resp.GetRequestId()
			if t := resp.GetThreadId(); t != "" && o.thread == "" {
				fmt.Fprintf(stderr, "thread %s (continue it with --thread %s)\n", t, t)
			}
		}
		if end, err := p.print(resp.GetEvent()); end || err != nil {
			return err
		}
	}
}

// cancelRequest asks the gateway to cancel a request its caller left, on
// a context of its own: the caller's is done.
func cancelRequest(callCtx context.Context, client gatewayv1.GatewayServiceClient, requestID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(callCtx), 5*time.Second)
	defer cancel()
	_, _ = client.CancelMessage(ctx, &gatewayv1.CancelMessageRequest{RequestId: requestID, Reason: "interrupted by the user"})
}

func agentList(ctx context.Context, o listOptions, stdout io.Writer) error {
	callCtx, client, conn, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var agents []*gatewayv1.Agent
	req := &gatewayv1.ListAgentsRequest{Capability: o.capability}
	for {
		resp, err := client.ListAgents(callCtx, req)
		if err != nil {
			return rpcFailure(ctx, err, o.addr, "")
		}
		agents = append(agents, resp.GetAgents()...)
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	return printAgents(stdout, agents)
}

func printAgents(w io.Writer, agents []*gatewayv1.Agent) error {
	if len(agents) == 0 {
		_, err := fmt.Fprintln(w, "No agents are connected.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCAPABILITIES\tRUNS ON\tSERVER\tBUSY")
	for _, a := range agents {
		busy := "no"
		if a.GetBusy() {
			busy = "yes"
		}
		if q := a.GetQueuedRequests(); q > 0 {
			busy += fmt.Sprintf(" (+%d queued)", q)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.GetAgentId(), orDash(a.GetName()),
			orDash(strings.Join(a.GetCapabilities(), ",")), runsOn(a.GetMetadata()), orDash(a.GetServerId()), busy)
	}
	return tw.Flush()
}

// runsOn says where an agent runs, from its metadata: its host, and for
// an agent the runner started (tagged "runner"), that it is the runner's.
func runsOn(md *covenpb.AgentMetadata) string {
	host := orDash(md.GetHostname())
	if slices.Contains(md.GetWorkspaces(), "runner") {
		return "runner:" + host
	}
	return host
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// rpcError is a failed call told in one line, still unwrapping to the gRPC
// status for callers that need the code.
type rpcError struct {
	summary string
	err     error
}

func (e *rpcError) Error() string { return e.summary }
func (e *rpcError) Unwrap() error { return e.err }

// rpcFailure explains a failed call in terms of what the user asked for.
func rpcFailure(ctx context.Context, err error, addr, agentID string) error {
	if ctx.Err() != nil {
		// Ctrl-C: the user knows; send has already asked the gateway to
		// cancel the request.
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	st := status.Convert(err)
	var summary string
	switch st.Code() {
	case codes.NotFound:
		summary = fmt.Sprintf("agent %q is not connected to the gateway at %s; 'conclave agent list' shows which are", agentID, addr)
	case codes.Unavailable:
		summary = fmt.Sprintf("gateway %s unavailable: %s", addr, st.Message())
	case codes.ResourceExhausted:
		summary = fmt.Sprintf("agent %q is too busy: %s", agentID, st.Message())
	case codes.Unauthenticated, codes.PermissionDenied:
		summary = fmt.Sprintf("gateway %s refused the token (--token or $CONCLAVE_TOKEN): %s", addr, st.Message())
	default:
		summary = fmt.Sprintf("gateway %s: %s (%s)", addr, st.Message(), st.Code())
	}
	return &rpcError{summary: summary, err: err}
}

// colorful reports whether w is a terminal that takes ANSI styling; NO_COLOR
// (no-color.org) turns it off.
func colorful(w io.Writer) bool {
	if _, off := os.LookupEnv("NO_COLOR"); off {
		return false
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// replyPrinter writes an agent's reply to a terminal as it arrives: text
// flows inline, and everything else gets a line of its own.
type replyPrinter struct {
	w       io.Writer
	color   bool
	saveDir string

	midLine bool // the last text chunk left its line open
	// summarized is set when the last thing printed was a line of the
	// printer's own (a tool call, a file), which has ended the line the
	// agent's next text may start by ending.
	summarized bool
	sawText    bool
	tools      map[string]string // tool use ID → tool name, to label results
}

// print renders one event. It reports whether the event ended the reply, and
// for an error or a cancellation, the error to exit with.
func (p *replyPrinter) print(ev *covenpb.MessageResponse) (end bool, err error) {
	switch e := ev.GetEvent().(type) {
	case *covenpb.MessageResponse_Thinking:
		p.line(p.dim("thinking: " + e.Thinking))
	case *covenpb.MessageResponse_Text:
		text := e.Text
		if p.summarized {
			text = strings.TrimPrefix(text, "\n")
			p.summarized = false
		}
		if text == "" {
			return false, nil
		}
		fmt.Fprint(p.w, text)
		p.sawText = true
		p.midLine = !strings.HasSuffix(text, "\n")
	case *covenpb.MessageResponse_ToolUse:
		if p.tools == nil {
			p.tools = map[string]string{}
		}
		p.tools[e.ToolUse.GetId()] = e.ToolUse.GetName()
		p.line(fmt.Sprintf("[tool] %s %s", e.ToolUse.GetName(), oneLine(e.ToolUse.GetInputJson())))
	case *covenpb.MessageResponse_ToolResult:
		label := "[tool result]"
		if e.ToolResult.GetIsError() {
			label = "[tool error]"
		}
		name := p.tools[e.ToolResult.GetId()]
		if name == "" {
			name = e.ToolResult.GetId()
		}
		p.line(fmt.Sprintf("%s %s: %s", label, name, oneLine(e.ToolResult.GetOutput())))
	case *covenpb.MessageResponse_ToolState:
		state := strings.ToLower(strings.TrimPrefix(e.ToolState.GetState().String(), "TOOL_STATE_"))
		name := p.tools[e.ToolState.GetId()]
		if name == "" {
			name = e.ToolState.GetId()
		}
		if d := e.ToolState.GetDetail(); d != "" {
			state += " (" + oneLine(d) + ")"
		}
		p.line(p.dim(fmt.Sprintf("[tool] %s: %s", name, state)))
	case *covenpb.MessageResponse_File:
		return false, p.file(e.File)
	case *covenpb.MessageResponse_SessionInit:
		p.line(p.dim("session: " + e.SessionInit.GetSessionId()))
	case *covenpb.MessageResponse_Usage:
		u := e.Usage
		p.line(p.dim(fmt.Sprintf("usage: %d tokens in, %d out", u.GetInputTokens(), u.GetOutputTokens())))
	case *covenpb.MessageResponse_Done:
		if !p.sawText && e.Done.GetFullResponse() != "" {
			fmt.Fprint(p.w, e.Done.GetFullResponse())
			p.midLine = !strings.HasSuffix(e.Done.GetFullResponse(), "\n")
		}
		p.endLine()
		return true, nil
	case *covenpb.MessageResponse_Error:
		p.endLine()
		return true, fmt.Errorf("the agent failed: %s", e.Error)
	case *covenpb.MessageResponse_Cancelled:
		p.endLine()
		return true, fmt.Errorf("the request was cancelled: %s", e.Cancelled.GetReason())
	}
	return false, nil
}

func (p *replyPrinter) file(f *covenpb.FileData) error {
	desc := fmt.Sprintf("[file] %s (%s, %s)", f.GetFilename(), orDash(f.GetMimeType()), byteSize(len(f.GetData())))
	if p.saveDir != "" {
		path, err := saveFile(p.saveDir, f.GetFilename(), f.GetData())
		if err != nil {
			p.line(desc)
			return err
		}
		desc += " saved to " + path
	}
	p.line(desc)
	return nil
}

// saveFile writes data into dir under the file's base name only: the name
// comes from the agent and must not choose where on disk it lands.
func saveFile(dir, name string, data []byte) (string, error) {
	base := filepath.Base(strings.ReplaceAll(name, `\`, "/"))
	switch base {
	case ".", "..", "/":
		base = "file"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("save %s: %w", name, err)
	}
	path := filepath.Join(dir, base)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("save %s: %w", name, err)
	}
	return path, nil
}

// line prints s on a line of its own, ending streamed text's line first.
func (p *replyPrinter) line(s string) {
	p.endLine()
	fmt.Fprintln(p.w, s)
	p.summarized = true
}

func (p *replyPrinter) endLine() {
	if p.midLine {
		fmt.Fprintln(p.w)
		p.midLine = false
	}
}

func (p *replyPrinter) dim(s string) string {
	if !p.color {
		return s
	}
	return "\x1b[2m" + s + "\x1b[0m"
}

// oneLine shortens s to a single line of at most 120 runes for a summary.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	first, more, multi := strings.Cut(s, "\n")
	if r := []rune(first); len(r) > 120 {
		first = string(r[:119]) + "…"
	}
	if multi {
		first += fmt.Sprintf(" (+%d more lines)", strings.Count(more, "\n")+1)
	}
	return first
}

func byteSize(n int) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
}
