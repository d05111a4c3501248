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

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// run runs the launch of in, whose claim's end arrives on claim. The
// agent's process is started while the claim is written (it takes far
// longer to start than a write takes), and is killed unspoken-to if the
// claim is lost; nothing is recorded or logged before the claim holds. It
// returns errDuplicate for a lost claim, and errStopping, to leave the
// launch on the queue, when the runner is shutting down.
func (ss *session) run(ctx context.Context, in *records.Instance, claim <-chan claimResult) error {
	defer ss.statusWrites.Wait()
	ss.open(ctx, claim)
	defer ss.log.Close()
	if !in.PendingTurn() && in.TurnDone > 0 {
		return ss.endNothingPending(ctx)
	}
	if in.PendingTurn() && in.CancelTurn == in.Turn {
		if ended, err := ss.endCancelledWhileGone(ctx); ended {
			return err
		}
	}
	typ, ok := ss.s.o.Registry.Get(ss.launch.AgentType)
	if !ok || !typ.Enabled {
		if err := ss.awaitClaim(); err != nil {
			return err
		}
		return ss.fail(ctx, "bad_type", fmt.Sprintf("agent type %q is not registered or not enabled", ss.launch.AgentType))
	}
	env := ss.launchEnv(typ)
	start := ss.traceStart(ctx, env)
	defer start.end(nil, nil)
	startCtx, stopStart := ss.startContext(ctx)
	defer stopStart()
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
	link := ss.expectHost(typ)
	if link != nil {
		defer ss.releaseLink(link)
	}
	stderr := &lineWriter{log: ss.log, stream: StreamStderr}
	proc, startErr := ss.s.o.Executor.Start(startCtx, ss.spec(typ, env), stderr)
	start.end(proc, startErr)
	if ended, err := ss.settleStart(ctx, proc, startErr); ended {
		return err
	}
	ss.attach(proc, link, typ)
	defer ss.armTimeout(typ, link).Stop()
	if link != nil {
		return ss.runHosted(ctx, proc, link)
	}
	return ss.runStdio(ctx, proc, typ, stderr)
}

// open begins the launch: it keeps the worker's span for updates to join,
// opens the instance's log, held until the claim holds, and keeps claim
// for awaitClaim.
func (ss *session) open(ctx context.Context, claim <-chan claimResult) {
	ss.launchSpan = trace.SpanContextFromContext(ctx)
	ss.log = ss.s.logs.open(ctx, ss.launch.ID)
	ss.log.Hold()
	ss.claim = claim
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

// endNothingPending ends, once the claim holds, a launch delivered again
// after its runner died with the agent idle: there is nothing to run, and
// a later prompt resumes the session.
func (ss *session) endNothingPending(ctx context.Context) error {
	if err := ss.awaitClaim(); err != nil {
		return err
	}
	ss.s.o.Metrics.Launch("nothing_pending")
	ss.setStatus(ctx, func(in *records.Instance) { in.DoneSeq = ss.seq })
	ss.log.Add(StreamRunner, fmt.Sprintf("launch %d ended: delivered again with no prompt pending, so nothing was started", ss.seq))
	return nil
}

// endCancelledWhileGone ends, once the claim holds, a launch whose turn was
// cancelled while its runner was gone: the turn ends stopped, and nothing
// is started for it. It reports whether it ended the launch: not when the
// claim shows a turn that is not cancelled.
func (ss *session) endCancelledWhileGone(ctx context.Context) (ended bool, err error) {
	if err := ss.awaitClaim(); err != nil {
		return true, err
	}
	if ss.launch.CancelTurn != ss.launch.Turn {
		return false, nil
	}
	ss.s.o.Metrics.Launch("cancelled")
	ss.setStatus(ctx, func(in *records.Instance) {
		in.Status, in.TurnDone, in.Prompt, in.CancelTurn, in.DoneSeq = records.StatusStopped, in.Turn, "", 0, ss.seq
		if in.FinishedAt.IsZero() {
			in.FinishedAt = time.Now().UTC()
		}
	})
	ss.log.Add(StreamRunner, fmt.Sprintf("launch %d ended (cancelled while no runner held it; nothing was started)", ss.seq))
	return true, nil
}

// launchEnv is the agent's environment: its type's, and the launch's over
// it.
func (ss *session) launchEnv(typ agenttype.Type) map[string]string {
	env := maps.Clone(typ.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, ss.launch.Env)
	return env
}

// traceStart starts the span of the agent's start, a span of the launch's
// trace, and sets env's TRACEPARENT to it: the agent's (or agent-host's)
// own spans continue from it.
func (ss *session) traceStart(ctx context.Context, env map[string]string) *startSpan {
	spanCtx, span := ss.s.tracer.Start(ctx, "start agent", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("conclave.executor", ss.s.o.Executor.Name()),
			attribute.String("conclave.instance_id", ss.launch.ID), attribute.Int64("conclave.launch", int64(ss.seq))))
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(spanCtx, carrier)
	if tp := carrier["traceparent"]; tp != "" {
		env["TRACEPARENT"] = tp
	}
	return &startSpan{span: span, open: true}
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

// startContext is the context of the executor's Start: kill cancels it,
// so that a session killed as its agent starts does not wait for the
// start to end.
func (ss *session) startContext(ctx context.Context) (context.Context, context.CancelFunc) {
	startCtx, stopStart := context.WithCancel(ctx)
	ss.mu.Lock()
	ss.stopStart = stopStart
	ss.mu.Unlock()
	return startCtx, stopStart
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

// expectHost registers the launch's agent-host, when agents run behind
// agent-host, and returns the link it will dial in on (nil: none). The
// caller releases the link unless it attaches it.
func (ss *session) expectHost(typ agenttype.Type) HostLink {
	if ss.s.o.Hosts == nil {
		return nil
	}
	h := HostHandlers{OnUpdate: ss.onUpdate, OnLog: ss.log.Add, OnPermission: ss.hostedGovernor(typ)}
	if ss.hostGateway(typ).AgentID != "" {
		h.OnGatewayMessage = func(ctx context.Context, content string, accepted func(int)) error {
			// The turn continues the gateway client's trace, which ctx
			// carries.
			return ss.promptAccepted(ctx, content, trace.SpanContextFromContext(ctx), accepted)
		}
		h.OnGatewayCancel = ss.cancel
	}
	return ss.s.o.Hosts.Expect(ss.launch.ID, int64(ss.seq), h)
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

// spec is what the executor starts: the agent, with agent-host's settings
// when agents run behind it.
func (ss *session) spec(typ agenttype.Type, env map[string]string) executor.Spec {
	o := ss.s.o
	spec := executor.Spec{InstanceID: ss.launch.ID, TaskID: ss.launch.TaskID, Type: typ, Workspace: ss.launch.Workspace, Env: env, Launch: int64(ss.seq)}
	if o.Hosts != nil {
		spec.Host = o.Hosts.Spec(ss.launch.ID, int64(ss.seq), typ, ss.launch.SessionID, ss.hostGateway(typ))
	}
	return spec
}

// settleStart awaits the claim once the executor's Start has returned with
// proc or startErr, and reports whether the launch ended there: an agent
// started for a claim that was lost is killed unspoken-to, and a start
// that failed (or that a kill aborted) ends the launch.
func (ss *session) settleStart(ctx context.Context, proc executor.Process, startErr error) (ended bool, err error) {
	if err := ss.awaitClaim(); err != nil {
		if startErr == nil {
			_ = proc.Kill()
			_ = proc.Wait()
		}
		return true, err
	}
	if startErr != nil {
		if kind, why := ss.killedWhy(); kind != stopNone {
			return true, ss.end(ctx, nil, "", "", nil, kind, why)
		}
		return true, ss.fail(ctx, "start_failed", startErr.Error())
	}
	return false, nil
}

// attach makes the started agent's process (and its agent-host link) the
// session's, for kill to reach, and logs the start. A session killed while
// the agent was starting kills it now, or, as the runner shuts down,
// leaves a hosted agent to the next runner.
func (ss *session) attach(proc executor.Process, link HostLink, typ agenttype.Type) {
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
	ss.log.Add(StreamRunner, fmt.Sprintf("started %s as %s %s (launch %d)", typ.ID, ss.s.o.Executor.Name(), proc.ID(), ss.seq))
}

// armTimeout sets the launch's limits from its agent type and arms its
// timeout, whose timer it returns for the caller to stop.
func (ss *session) armTimeout(typ agenttype.Type, link HostLink) *time.Timer {
	o := ss.s.o
	// The timeout covers the whole launch, and kills the whole group. A
	// Job has it as its own deadline, which says so when it passes: this
	// is the backstop.
	ss.timeout = typ.EffectiveTimeout()
	ss.silence = cmp.Or(typ.SilenceTimeout, o.SilenceTimeout)
	limit := ss.timeout
	if link != nil {
		limit += o.HostExitGrace
	}
	return time.AfterFunc(limit, func() {
		ss.kill(stopFailure, fmt.Sprintf("timed out after %s", ss.timeout))
	})
}

// runStdio converses with a started agent over its stdio, then ends the
// launch.
func (ss *session) runStdio(ctx context.Context, proc executor.Process, typ agenttype.Type, stderr *lineWriter) error {
	o := ss.s.o
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
		Dialect: typ.Protocol, Workspace: ss.launch.Workspace, Permission: typ.Permission, AuthMethod: typ.AuthMethod, MaxLine: o.MaxLine,
		Govern:   ss.governor(typ, ss.launch.Workspace, ss.launch.Workspace),
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
	switch {
	case outcome == "" && exitErr != nil:
		outcome, reason = "exited", fmt.Sprintf("the agent exited: %v", exitErr)
	case outcome == acp.OutcomeExited && exitErr != nil:
		// Gone during the handshake: how it went.
		reason += fmt.Sprintf(" (%v)", exitErr)
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
