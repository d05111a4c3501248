package supervisor

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// claimResult is how a launch's claim ended: the instance as claimed, or
// errDuplicate (another delivery has it), or a store error.
type claimResult struct {
	in  *records.Instance
	err error
}

// run runs the launch of in delivered as m, whose claim ends on claim. The
// agent's process is started while the claim is written (it takes far
// longer to start than a write takes), and is killed unspoken-to if the
// claim is lost; nothing is recorded or logged before the claim holds. It
// returns errDuplicate for a lost claim, and errStopping, to leave the
// launch on the queue, when the runner is shutting down.
func (ss *session) run(ctx context.Context, in *records.Instance, m queue.Message, claim <-chan claimResult) error {
	defer ss.statusWrites.Wait()
	ss.launchSpan = trace.SpanContextFromContext(ctx)
	ss.log = ss.s.logs.open(ctx, ss.launch.ID)
	ss.log.Hold()
	defer ss.log.Close()
	ss.claim = claim
	o := ss.s.o

	if !in.PendingTurn() && in.TurnDone > 0 {
		if err := ss.awaitClaim(); err != nil {
			return err
		}
		// Delivered again after its runner died with the agent idle: there
		// is nothing to run, and a later prompt resumes the session.
		ss.s.o.Metrics.Launch("nothing_pending")
		ss.setStatus(ctx, func(in *records.Instance) { in.DoneSeq = ss.seq })
		ss.log.Add(StreamRunner, fmt.Sprintf("launch %d ended: delivered again with no prompt pending, so nothing was started", ss.seq))
		return nil
	}
	if in.PendingTurn() && in.CancelTurn == in.Turn {
		// Cancelled while its runner was gone: the turn ends stopped, and
		// nothing is started for it.
		if err := ss.awaitClaim(); err != nil {
			return err
		}
		if ss.launch.CancelTurn == ss.launch.Turn {
			ss.s.o.Metrics.Launch("cancelled")
			ss.setStatus(ctx, func(in *records.Instance) {
				in.Status, in.TurnDone, in.Prompt, in.CancelTurn, in.DoneSeq = records.StatusStopped, in.Turn, "", 0, ss.seq
				if in.FinishedAt.IsZero() {
					in.FinishedAt = time.Now().UTC()
				}
			})
			ss.log.Add(StreamRunner, fmt.Sprintf("launch %d ended (cancelled while no runner held it; nothing was started)", ss.seq))
			return nil
		}
	}
	typ, ok := o.Registry.Get(ss.launch.AgentType)
	if !ok || !typ.Enabled {
		if err := ss.awaitClaim(); err != nil {
			return err
		}
		return ss.fail(ctx, "bad_type", fmt.Sprintf("agent type %q is not registered or not enabled", ss.launch.AgentType))
	}
	env := maps.Clone(typ.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, ss.launch.Env)
	// The agent's start is a span of the launch's trace, and the agent's
	// (or agent-host's) own spans continue from it.
	spanCtx, span := ss.s.tracer.Start(ctx, "start agent", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("conclave.executor", o.Executor.Name()),
			attribute.String("conclave.instance_id", ss.launch.ID), attribute.Int64("conclave.launch", int64(ss.seq))))
	start := &startSpan{span: span, open: true}
	defer start.end(nil, nil)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(spanCtx, carrier)
	if tp := carrier["traceparent"]; tp != "" {
		env["TRACEPARENT"] = tp
	}
	stderr := &lineWriter{log: ss.log, stream: StreamStderr}
	startCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	ss.mu.Lock()
	ss.stopStart = stopStart
	ss.mu.Unlock()
	defer ss.killOnShutdown()()
	if kind, why := ss.killedWhy(); kind != stopNone {
		// Cancelled or deleted as it was claimed.
		if err := ss.awaitClaim(); err != nil {
			return err
		}
		return ss.end(ctx, nil, "", "", nil, kind, why)
	}
	if typ.Protocol == agenttype.ProtocolOneshot {
		if err := ss.awaitClaim(); err != nil {
			return err
		}
		return ss.runOneshot(ctx, typ, env)
	}
	spec := executor.Spec{InstanceID: ss.launch.ID, TaskID: ss.launch.TaskID, Type: typ, Workspace: ss.launch.Workspace, Env: env, Launch: int64(ss.seq)}
	var link HostLink
	if o.Hosts != nil {
		link = o.Hosts.Expect(ss.launch.ID, int64(ss.seq), ss.onUpdate, ss.log.Add)
		defer ss.releaseLink(link)
		spec.Host = o.Hosts.Spec(ss.launch.ID, int64(ss.seq), typ, ss.launch.SessionID)
	}
	proc, err := o.Executor.Start(startCtx, spec, stderr)
	start.end(proc, err)
	if cerr := ss.awaitClaim(); cerr != nil {
		if err == nil {
			_ = proc.Kill()
			_ = proc.Wait()
		}
		return cerr
	}
	if err != nil {
		if kind, why := ss.killedWhy(); kind != stopNone {
			return ss.end(ctx, nil, "", "", nil, kind, why)
		}
		return ss.fail(ctx, "start_failed", err.Error())
	}
	ss.mu.Lock()
	ss.proc, ss.link = proc, link
	killedKind := ss.killKind
	ss.mu.Unlock()
	switch {
	case killedKind == stopShutdown && link != nil:
		// Shutting down as it was started: the next runner adopts it.
		link.Detach()
	case killedKind != stopNone:
		// Killed while it was being started.
		_ = proc.Kill()
	}
	ss.log.Add(StreamRunner, fmt.Sprintf("started %s as %s %s (launch %d)", typ.ID, o.Executor.Name(), proc.ID(), ss.seq))
	// The timeout covers the whole launch, and kills the whole group. A
	// Job has it as its own deadline, which says so when it passes: this
	// is the backstop.
	ss.timeout = typ.EffectiveTimeout()
	ss.silence = cmp.Or(typ.SilenceTimeout, o.SilenceTimeout)
	limit := ss.timeout
	if link != nil {
		limit += o.HostExitGrace
	}
	timeout := time.AfterFunc(limit, func() {
		ss.kill(stopFailure, fmt.Sprintf("timed out after %s", ss.timeout))
	})
	defer timeout.Stop()
	if link != nil {
		return ss.runHosted(ctx, proc, link)
	}
	exited := make(chan error, 1)
	go func() {
		err := proc.Wait()
		stderr.Flush()
		exited <- err
	}()

	stdio, ok := proc.(executor.StdioProcess)
	if !ok {
		_ = proc.Kill()
		return ss.end(ctx, proc, "start_failed", fmt.Sprintf("executor %s gave no stdio to speak ACP over", o.Executor.Name()), <-exited, stopNone, "")
	}
	client := acp.New(stdio.Stdout(), stdio.Stdin(), acp.Options{
		Dialect: typ.Protocol, Workspace: ss.launch.Workspace, Permission: typ.Permission, MaxLine: o.MaxLine,
		OnUpdate: ss.onUpdate, OnDrop: o.Metrics.Drop, Logger: ss.s.log.With("instance_id", ss.launch.ID),
	})
	defer client.Close()

	outcome, reason := ss.drive(ctx, client)
	ss.mu.Lock()
	ss.ending = true
	ss.mu.Unlock()
	// Close stdin: a well-behaved agent exits; one that does not is killed.
	_ = client.Close()
	var exitErr error
	select {
	case exitErr = <-exited:
	case <-time.After(o.CancelGrace):
		ss.kill(stopFailure, "did not exit after its stdin closed")
		exitErr = <-exited
	}
	kind, why := ss.killedWhy()
	return ss.end(ctx, proc, outcome, reason, exitErr, kind, why)
}

// awaitClaim waits for the launch's claim, once. A claim that holds
// brings the session up to date with the instance as claimed and lets its
// log through; a lost one discards the log, and its error is returned.
func (ss *session) awaitClaim() error {
	if ss.claimed {
		return nil
	}
	r := <-ss.claim
	if r.err != nil {
		ss.log.Discard()
		return r.err
	}
	ss.claimed = true
	ss.stMu.Lock()
	ss.in = r.in
	ss.stMu.Unlock()
	// What may have changed since the delivery read it (a cancel
	// recorded while no runner held the launch); the configuration
	// does not change.
	ss.launch.Turn, ss.launch.TurnDone, ss.launch.Prompt, ss.launch.CancelTurn = r.in.Turn, r.in.TurnDone, r.in.Prompt, r.in.CancelTurn
	ss.log.Release()
	return nil
}

// startSpan is the span of an agent's start; end ends it, once, with how
// the start went.
type startSpan struct {
	span trace.Span
	open bool
}

func (s *startSpan) end(proc executor.Process, err error) {
	if !s.open {
		return
	}
	s.open = false
	if err != nil {
		s.span.RecordError(err)
		s.span.SetStatus(codes.Error, err.Error())
	} else if proc != nil {
		s.span.SetAttributes(attribute.String("conclave.container_id", proc.ID()))
	}
	s.span.End()
}

// killOnShutdown kills the session when the runner shuts down, which
// leaves its launch on the queue for the next runner; the func it returns
// ends the watch.
func (ss *session) killOnShutdown() (stop func()) {
	stopWatch := make(chan struct{})
	go func() {
		select {
		case <-ss.s.stopping:
			ss.kill(stopShutdown, "runner shutting down")
		case <-stopWatch:
		}
	}()
	return func() { close(stopWatch) }
}

// releaseLink lets go of a launch's agent-host link unless the session
// holds it (runHosted takes it over): after a lost claim or a failed
// start, another runner may be the one it belongs to.
func (ss *session) releaseLink(link HostLink) {
	ss.mu.Lock()
	held := ss.link != nil
	ss.mu.Unlock()
	if !held {
		link.Detach()
	}
}

// end records how the launch ended. What a turn recorded stands: an agent
// that is killed or exits badly once its turn has ended, idle, leaves the
// turn's status as it was.
func (ss *session) end(ctx context.Context, proc executor.Process, outcome, reason string, exitErr error, kind stopKind, why string) error {
	switch kind {
	case stopShutdown:
		ss.log.Add(StreamRunner, "stopped: runner shutting down; the launch will be retried")
		return errStopping
	case stopDeleted:
		ss.log.Add(StreamRunner, "stopped: "+why)
		return nil
	case stopSuperseded:
		ss.log.Add(StreamRunner, "stopped: "+why)
		return errOlderReceipt
	case stopCancel:
		outcome, reason = "cancelled", why
	case stopFailure, stopDead:
		if outcome == "" || outcome == "completed" {
			outcome, reason = "killed", why
		}
	}
	if outcome == "" && exitErr != nil {
		outcome, reason = "exited", fmt.Sprintf("the agent exited: %v", exitErr)
	}
	ss.s.o.Metrics.Launch(firstNonEmpty(outcome, "completed"))
	ss.setStatus(context.WithoutCancel(ctx), func(in *records.Instance) {
		in.DoneSeq = ss.seq
		if in.ContainerID == "" && proc != nil {
			// A launch that ended before its session was up.
			in.ContainerID = proc.ID()
		}
		if !in.Terminal() && !(in.PendingTurn() && in.Turn != ss.launch.Turn) {
			// No turn of this launch recorded how it ended. (A later
			// prompt, accepted as the agent went away, is resumed next:
			// its status is its own.)
			switch {
			case outcome == "cancelled":
				in.Status, in.Error = records.StatusStopped, reason
			case reason != "":
				in.Status, in.Error = records.StatusFailed, reason
			default:
				in.Status = records.StatusCompleted
			}
		}
		if in.PendingTurn() && in.Turn == ss.launch.Turn {
			// The launch's own turn never ran: it ends with the launch.
			in.TurnDone, in.Prompt = in.Turn, ""
		}
		if in.FinishedAt.IsZero() {
			in.FinishedAt = time.Now().UTC()
		}
	})
	how := firstNonEmpty(outcome, "completed")
	if reason != "" {
		how += ": " + reason
	}
	ss.log.Add(StreamRunner, fmt.Sprintf("launch %d ended (%s)", ss.seq, how))
	return nil
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
