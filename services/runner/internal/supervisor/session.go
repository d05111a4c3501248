package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/services/runner/internal/covenlink"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// errSessionEnding is a live session's refusal of a prompt as it ends;
// Prompt waits for the end and resumes the session for the prompt.
var errSessionEnding = fmt.Errorf("the agent is stopping; retry to resume it: %w", ErrBusy)

// stopKind says why a session's process was killed, which decides what is
// recorded.
type stopKind int

const (
	stopNone stopKind = iota
	// stopShutdown: nothing is recorded; the launch goes back on the queue.
	stopShutdown
	// stopDeleted and stopSuperseded: nothing is recorded; the instance is
	// gone, or another delivery of the launch has taken it over.
	stopDeleted
	stopSuperseded
	// stopCancel: the turn, or the launch, ends stopped.
	stopCancel
	// stopFailure: timed out, would not exit, and the like: failed.
	stopFailure
	// stopDead: a dead protocol, found mid-turn: failed.
	stopDead
)

// quiet reports whether a session killed so records nothing more.
func (k stopKind) quiet() bool { return k == stopShutdown || k == stopDeleted || k == stopSuperseded }

// pendingPrompt is an accepted prompt: its turn number and message, and
// the span its turn continues (a gateway client's; invalid: the launch's).
type pendingPrompt struct {
	turn    int
	message string
	parent  trace.SpanContext
}

// session is one launch of an instance: its process, client and turns.
type session struct {
	s   *Supervisor
	seq int
	log *instanceLog
	// launch is the instance as the launch's claim wrote it: its
	// configuration, and the turn it has to run.
	launch records.Instance
	// claimMsg and claimRecv are the delivery that claimed the launch; a
	// write that finds another claim stops the session.
	claimMsg  string
	claimRecv int
	// claim delivers how the launch's claim ended, and claimed is set once
	// it held; run's goroutine alone uses them (awaitClaim).
	claim   <-chan claimResult
	claimed bool

	// stMu guards in, the instance as last written.
	stMu sync.Mutex
	in   *records.Instance
	// statusWrites are setStatusBeside's writes in progress.
	statusWrites sync.WaitGroup

	mu     sync.Mutex
	client conversation
	proc   executor.Process
	// link is the launch's agent-host link, for a hosted agent.
	link HostLink
	// timeout is the launch's agent type's; silence its limit on an
	// agent's silence mid-turn.
	timeout time.Duration
	silence time.Duration
	// halt ends a oneshot conversation's run in progress (it has no proc).
	halt func()
	// stopStart aborts an executor's Start in progress.
	stopStart context.CancelFunc
	// turning: a prompt is accepted (or being accepted) and its turn has not
	// ended; turns counts them, so that a cancel's grace applies to its own.
	turning bool
	turns   int
	// turnID is the conversation's number for the turn begun last.
	turnID uint64
	// killKind and killed say why the process was killed, once it was.
	killKind stopKind
	killed   string
	prompts  chan pendingPrompt
	done     chan struct{}
	// ending: the session takes no more prompts; its process is stopping.
	ending bool
	// launchSpan is the worker's span, which updates join.
	launchSpan trace.SpanContext
	// curTurn is the durable number of the turn in progress; said is what
	// the agent said in it since its last tool call, saidBefore what it
	// said before that call (the stated reasons of its permission
	// requests).
	curTurn          int
	said, saidBefore string
	// turnCtx ends with the turn in progress: a hosted agent's permission
	// request waits no longer.
	turnCtx context.Context
	// asking counts the agent's permission requests being decided: an
	// agent waiting on its answer is not silent.
	asking atomic.Int32
	// coven is the agent's registration at the gateway, if it has one;
	// the updates of turn curTurn go there.
	coven *covenlink.Link
}

func newSession(s *Supervisor, in *records.Instance, m queue.Message, seq int) *session {
	return &session{s: s, seq: seq, launch: *in, in: in, claimMsg: m.ID, claimRecv: m.ReceiveCount,
		prompts: make(chan pendingPrompt, 1), done: make(chan struct{})}
}

// errClaimLost fences a session whose launch another delivery took over.
var errClaimLost = errors.New("the launch was taken over by another delivery")

// prompt stores a prompt for the live agent and hands it over.
func (ss *session) prompt(ctx context.Context, message string) error {
	return ss.promptAccepted(ctx, message, trace.SpanContext{}, nil)
}

// promptAccepted is prompt, calling accepted, if set, with the turn's
// number once it is stored, before the turn can begin.
func (ss *session) promptAccepted(ctx context.Context, message string, parent trace.SpanContext, accepted func(turn int)) error {
	ss.mu.Lock()
	client := ss.client
	switch {
	case client == nil || ss.turning:
		ss.mu.Unlock()
		return fmt.Errorf("instance %s has a turn in progress or is starting: %w", ss.launch.ID, ErrBusy)
	case ss.killed != "" || ss.ending:
		ss.mu.Unlock()
		return fmt.Errorf("instance %s: %w", ss.launch.ID, errSessionEnding)
	}
	// Reserved, so that the idle timer waits for it; begun, so that a
	// cancel from now on applies to it.
	ss.turning = true
	ss.turns++
	ss.turnID = client.BeginTurn()
	ss.mu.Unlock()
	in, err := ss.update(ctx, func(in *records.Instance) error {
		if in.Deleted {
			return fmt.Errorf("instance %s is being deleted: %w", in.ID, ErrFinished)
		}
		if in.PendingTurn() {
			return fmt.Errorf("instance %s has a prompt waiting: %w", in.ID, ErrBusy)
		}
		if in.DoneSeq >= ss.seq || in.LaunchSeq != ss.seq {
			// The agent went away as the prompt came: Prompt resumes it.
			return fmt.Errorf("instance %s: %w", in.ID, errSessionEnding)
		}
		in.Turn, in.Prompt = in.Turn+1, message
		in.Status, in.Progress, in.FinishedAt, in.Error = records.StatusRunning, 0, time.Time{}, ""
		return nil
	})
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err != nil {
		ss.turning = false
		client.AbandonTurn()
		return err
	}
	// The prompt is stored: from here it is run, by this session or, if it
	// is ending, by the launch handle resumes after it.
	if accepted != nil {
		accepted(in.Turn)
	}
	ss.prompts <- pendingPrompt{turn: in.Turn, message: message, parent: parent}
	return nil
}

func (ss *session) cancel(reason string) {
	ss.mu.Lock()
	client, turning, turnNo, turnID := ss.client, ss.turning, ss.turns, ss.turnID
	ss.mu.Unlock()
	if client == nil {
		ss.kill(stopCancel, "cancelled while starting: "+reason)
		return
	}
	if !turning {
		return
	}
	ss.log.Add(StreamRunner, "cancel requested: "+reason)
	// Armed first: sending the cancel may wait on an agent that does not
	// read its stdin, which the kill then ends.
	grace := time.AfterFunc(ss.s.o.CancelGrace, func() {
		ss.mu.Lock()
		still := ss.turning && ss.turns == turnNo
		ss.mu.Unlock()
		if still {
			ss.kill(stopCancel, fmt.Sprintf("the agent ignored session/cancel for %s", ss.s.o.CancelGrace))
		}
	})
	go func() {
		<-ss.done
		grace.Stop()
	}()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), ss.s.o.CancelGrace)
		defer cancel()
		if err := client.CancelTurn(ctx, reason, turnID); err != nil && ctx.Err() == nil {
			ss.kill(stopCancel, "cancelled, and the agent could not be told: "+err.Error())
		}
	}()
}

// kill ends the process group, once; the first reason is the one recorded.
func (ss *session) kill(kind stopKind, reason string) {
	ss.mu.Lock()
	proc, stopStart, halt, link := ss.proc, ss.stopStart, ss.halt, ss.link
	if ss.killed == "" {
		ss.killKind, ss.killed = kind, reason
	}
	ss.mu.Unlock()
	if stopStart != nil {
		stopStart()
	}
	if halt != nil {
		halt()
	}
	if link != nil && kind == stopShutdown {
		// A hosted agent outlives its runner: the next one adopts it.
		link.Detach()
		return
	}
	if proc != nil {
		_ = proc.Kill()
	}
}

func (ss *session) killedWhy() (stopKind, string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.killKind, ss.killed
}
