package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

type threadsOptions struct {
	gatewayFlags
	agentID string
	limit   int
}

func parseThreadsArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (threadsOptions, error) {
	var o threadsOptions
	fs := flag.NewFlagSet("conclave agent threads", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: conclave agent threads AGENT [flags]")
		fs.PrintDefaults()
	}
	o.register(fs, lookup)
	fs.IntVar(&o.limit, "limit", 50, "list at most this many threads")
	rest, err := parseInterleaved(fs, args)
	if err != nil {
		return threadsOptions{}, err
	}
	switch {
	case len(rest) != 1:
		return threadsOptions{}, errors.New("agent threads: give one agent ID")
	case o.limit < 1:
		return threadsOptions{}, errors.New("agent threads: --limit must be positive")
	}
	o.agentID = rest[0]
	return o, nil
}

// agentThreads lists an agent's threads, newest first.
func agentThreads(ctx context.Context, o threadsOptions, stdout io.Writer) error {
	callCtx, client, conn, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var threads []*gatewayv1.Thread
	req := &gatewayv1.ListThreadsRequest{AgentId: o.agentID, PageSize: int32(min(o.limit, 1000))}
	for len(threads) < o.limit {
		resp, err := client.ListThreads(callCtx, req)
		if err != nil {
			return rpcFailure(ctx, err, o.addr, o.agentID)
		}
		threads = append(threads, resp.GetThreads()...)
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if len(threads) > o.limit {
		threads = threads[:o.limit]
	}
	if len(threads) == 0 {
		_, err := fmt.Fprintf(stdout, "Agent %q has no threads you can read.\n", o.agentID)
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "THREAD\tSTARTED\tCLIENT")
	for _, t := range threads {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.GetThreadId(), when(t.GetStartedAt().AsTime()), orDash(t.GetClientId()))
	}
	return tw.Flush()
}

func when(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

type historyOptions struct {
	gatewayFlags
	threadID string
	after    string
}

func parseHistoryArgs(args []string, lookup func(string) (string, bool), stderr io.Writer) (historyOptions, error) {
	var o historyOptions
	fs := flag.NewFlagSet("conclave agent history", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: conclave agent history THREAD [flags]")
		fs.PrintDefaults()
	}
	o.register(fs, lookup)
	fs.StringVar(&o.after, "after", "", "only what follows this entry_id")
	rest, err := parseInterleaved(fs, args)
	if err != nil {
		return historyOptions{}, err
	}
	if len(rest) != 1 {
		return historyOptions{}, errors.New("agent history: give one thread ID")
	}
	o.threadID = rest[0]
	return o, nil
}

// agentHistory prints a thread as a conversation, oldest first.
func agentHistory(ctx context.Context, o historyOptions, stdout io.Writer) error {
	callCtx, client, conn, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	p := &conversationPrinter{reply: replyPrinter{w: stdout, color: colorful(stdout)}}
	req := &gatewayv1.HistoryRequest{ThreadId: o.threadID, After: o.after, PageSize: 500}
	for {
		resp, err := client.History(callCtx, req)
		if err != nil {
			return historyFailure(ctx, err, o.addr, o.threadID)
		}
		for _, e := range resp.GetEntries() {
			p.print(e)
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	p.reply.endLine()
	if !p.any {
		_, err := fmt.Fprintf(stdout, "Thread %q has nothing to show.\n", o.threadID)
		return err
	}
	return nil
}

// historyFailure is rpcFailure for a thread: NOT_FOUND names the thread,
// which the gateway also answers for a thread of another client.
func historyFailure(ctx context.Context, err error, addr, threadID string) error {
	if ctx.Err() == nil && status.Code(err) == codes.NotFound {
		return &rpcError{summary: fmt.Sprintf("thread %q not found on the gateway at %s, or it is another client's; 'conclave agent threads AGENT' lists yours", threadID, addr), err: err}
	}
	return rpcFailure(ctx, err, addr, "")
}

// conversationPrinter writes a thread's entries as a conversation: a
// heading for each message and for each answer, the answer as send
// prints it live, and how each request ended.
type conversationPrinter struct {
	reply    replyPrinter
	any      bool
	answered string // the request whose answer's heading is printed
}

func (p *conversationPrinter) heading(s string) {
	p.reply.line(p.reply.dim("── " + s))
	p.reply.summarized = false
}

func (p *conversationPrinter) print(e *gatewayv1.ThreadEntry) {
	p.any = true
	switch x := e.GetEntry().(type) {
	case *gatewayv1.ThreadEntry_Message:
		m := x.Message
		from := m.GetSender()
		if from == "" {
			from = orDash(m.GetClientId())
		}
		p.reply = replyPrinter{w: p.reply.w, color: p.reply.color}
		p.heading(fmt.Sprintf("%s → %s · %s", from, e.GetAgentId(), when(e.GetTime().AsTime())))
		fmt.Fprintln(p.reply.w, m.GetContent())
		for _, a := range m.GetAttachments() {
			p.reply.line(fmt.Sprintf("[attachment] %s (%s, %s)", a.GetFilename(), orDash(a.GetMimeType()), byteSize(int(a.GetSize()))))
		}
	case *gatewayv1.ThreadEntry_Event:
		if p.answered != e.GetRequestId() {
			p.answered = e.GetRequestId()
			p.heading(e.GetAgentId())
		}
		if f := e.GetFile(); f != nil {
			p.reply.line(fmt.Sprintf("[file] %s (%s, %s; not kept)", f.GetFilename(), orDash(f.GetMimeType()), byteSize(int(f.GetSize()))))
			return
		}
		switch ev := x.Event.GetEvent().(type) {
		case *covenpb.MessageResponse_Error:
			p.reply.line("[error] " + ev.Error)
		case *covenpb.MessageResponse_Cancelled:
			p.reply.line("[cancelled] " + ev.Cancelled.GetReason())
		default:
			_, _ = p.reply.print(x.Event)
		}
	case *gatewayv1.ThreadEntry_Outcome:
		if o := x.Outcome; o.GetEnding() == gatewayv1.Ending_ENDING_AGENT_GONE {
			p.reply.line("[cut off] " + o.GetMessage())
		}
		p.reply.endLine()
	}
}
