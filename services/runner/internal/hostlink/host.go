package hostlink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

// agent-host's exit codes of its own; otherwise it exits with the agent's
// (128+n for a signal n).
const (
	// ExitUnavailable: the runner was unreachable, or did not expect the
	// launch, for longer than the give-up time; the agent was killed.
	ExitUnavailable = 69
	// ExitRefused: the runner refused the link (a bad token, or the launch
	// superseded or closed); the agent was killed or never started.
	ExitRefused = 77
	// ExitStartFailed: the agent's command could not be started.
	ExitStartFailed = 127
)

// HostOptions are agent-host's dependencies.
type HostOptions struct {
	Settings Settings
	// Command is the agent's command line.
	Command []string
	// AgentEnv is the agent's environment (AgentEnv of agent-host's);
	// TRACEPARENT is set in it from the span agent-host runs under.
	AgentEnv []string
	Logger   *slog.Logger
	Tracer   trace.Tracer
	// DialOptions are added to the dials of the runner and the gateway.
	DialOptions []grpc.DialOption
	// Hostname is where the agent runs (its pod), as registered at the
	// gateway.
	Hostname string
}

// host is one agent-host run.
type host struct {
	o      HostOptions
	s      Settings
	log    *slog.Logger
	tracer trace.Tracer
	buf    *eventBuffer
	hostID string
	client runnerv1.AgentHostServiceClient

	mu sync.Mutex
	// linkID is the runner link the host takes commands from; lastCmd the
	// last of its commands applied, and ackedCmd what the runner was told.
	linkID  string
	lastCmd int64
	// cmdKick wakes the sender: a command was applied.
	cmdKick chan struct{}
	// agent is set before the link starts and never changes.
	agent *agentRun

	welcomed     chan struct{}
	welcomedOnce sync.Once
	// refused carries the one error that ends the link for good.
	refused     chan error
	refusedOnce sync.Once
	// finishing: the agent's exit is pushed; the sender half-closes the
	// stream once everything is acknowledged.
	finishing chan struct{}
	finishOne sync.Once

	// permissions are the agent's permission requests the runner has not
	// answered yet (the librarian policy), by id; permSeq numbers them.
	permissions map[int64]*pendingPermission
	permSeq     int64

	// gateway is the agent's registration at the coven gateway, when the
	// launch asks for it (CONCLAVE_AGENT_HOST_GATEWAY_ADDR); set before
	// the link starts and never changed.
	gateway *hostGateway
}

// RunHost runs agent-host: it links to the runner, then runs the agent and
// relays between them until the agent exits and its last events are
// acknowledged (or the runner refuses the link, or stays unreachable past
// the give-up time). It returns the process's exit code, and an error when
// agent-host itself failed.
func RunHost(ctx context.Context, o HostOptions) (int, error) {
	if len(o.Command) == 0 {
		return 2, errors.New("no agent command: agent-host [--] <command> [args...]")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Tracer == nil {
		o.Tracer = noop.NewTracerProvider().Tracer("")
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	h := &host{o: o, s: o.Settings, log: o.Logger.With("instance_id", o.Settings.InstanceID, "launch", o.Settings.Launch),
		tracer: o.Tracer, buf: newEventBuffer(o.Settings.BufferBytes), hostID: hex.EncodeToString(id[:]),
		cmdKick: make(chan struct{}, 1), welcomed: make(chan struct{}), refused: make(chan error, 1), finishing: make(chan struct{}),
		permissions: map[int64]*pendingPermission{}}
	h.agent = newAgentRun(h)
	ctx, span := h.tracer.Start(ctx, "agent-host")
	defer span.End()
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	}, o.DialOptions...)
	conn, err := grpc.NewClient(o.Settings.RunnerAddr, dial...)
	if err != nil {
		return 2, fmt.Errorf("CONCLAVE_AGENT_HOST_RUNNER_ADDR: %w", err)
	}
	defer conn.Close()
	h.client = runnerv1.NewAgentHostServiceClient(conn)
	if o.Settings.GatewayAddr != "" {
		gw, err := grpc.NewClient(o.Settings.GatewayAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, o.DialOptions...)...)
		if err != nil {
			return 2, fmt.Errorf("CONCLAVE_AGENT_HOST_GATEWAY_ADDR: %w", err)
		}
		defer gw.Close()
		h.gateway = newHostGateway(h, gw)
		// However the agent ended, its registration ends with it.
		defer h.gateway.close("agent-host stopped")
	}

	// The link outlives a signal by a bounded drain, to report the exit.
	linkCtx, stopLink := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLink()
	linkDone := make(chan struct{})
	go func() {
		defer close(linkDone)
		h.linkLoop(linkCtx)
	}()
	select {
	case <-h.welcomed:
	case err := <-h.refused:
		h.buf.close()
		return exitCodeFor(err), err
	case <-ctx.Done():
		h.buf.close()
		return 1, ctx.Err()
	}

	code, runErr := h.runAgent(ctx)
	// The agent is gone and its Exited pushed: wait for the runner to take
	// everything, then end the stream.
	h.finishOne.Do(func() { close(h.finishing) })
	drain := make(<-chan time.Time)
	if ctx.Err() != nil {
		drain = time.After(h.s.KillGrace)
	}
	for {
		n, changed := h.buf.pending()
		if n == 0 {
			break
		}
		select {
		case <-changed:
			continue
		case err := <-h.refused:
			h.buf.close()
			if h.agent.endedByRefusal() {
				return exitCodeFor(err), errors.Join(runErr, err)
			}
			// The agent ended on its own; the runner will take no more
			// (it has the exit, or the launch moved on): the pod's status
			// is the agent's.
			return code, errors.Join(runErr, err)
		case <-drain:
			h.buf.close()
			return code, errors.Join(runErr, errors.New("the runner did not acknowledge the agent's last events before agent-host stopped"))
		}
	}
	select {
	case <-linkDone:
	case <-time.After(h.s.KillGrace):
	}
	return code, runErr
}

// errGaveUp: the runner was unreachable past the give-up time.
var errGaveUp = errors.New("the runner was unreachable for too long")

func exitCodeFor(err error) int {
	if errors.Is(err, errGaveUp) {
		return ExitUnavailable
	}
	return ExitRefused
}

func (h *host) refuse(err error) {
	h.refusedOnce.Do(func() { h.refused <- err })
	h.buf.close()
	a := h.agent
	a.mu.Lock()
	a.halted = true
	if !a.exited {
		a.refused = true
		if a.why == "" {
			a.why = err.Error()
		}
	}
	a.mu.Unlock()
	a.killGroup()
}

// note records a line of agent-host's own in the instance's log.
func (h *host) note(ctx context.Context, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	h.log.InfoContext(ctx, "agent-host: "+text)
	_ = h.buf.push(ctx, &runnerv1.HostEvent{Kind: &runnerv1.HostEvent_Log{Log: &runnerv1.AgentLog{Stream: "host", Text: text}}})
}

// linkLoop keeps a stream to the runner, reconnecting with backoff, until
// the host is done or the runner refuses it for good.
func (h *host) linkLoop(ctx context.Context) {
	backoff := h.s.BackoffMin
	lost := time.Now()
	lastWhy := ""
	for {
		welcomed, done, err := h.stream(ctx)
		if done || ctx.Err() != nil {
			return
		}
		if welcomed {
			lost, backoff = time.Now(), h.s.BackoffMin
		}
		switch status.Code(err) {
		case codes.Unauthenticated, codes.PermissionDenied, codes.InvalidArgument:
			h.log.Error("agent-host: the runner refused the link", "error", err)
			h.refuse(fmt.Errorf("the runner refused the link: %w", err))
			return
		}
		if time.Since(lost) > h.s.GiveUp {
			h.log.Error("agent-host: giving up on the runner", "unreachable_for", time.Since(lost).String(), "error", err)
			h.refuse(fmt.Errorf("%w (%s; last: %v)", errGaveUp, h.s.GiveUp, err))
			return
		}
		if why := status.Code(err).String(); why != lastWhy || welcomed {
			h.log.Warn("agent-host: the link to the runner ended; reconnecting", "error", err)
			lastWhy = why
		}
		// Full jitter, so that the pods of a restarted runner do not all
		// dial at once.
		wait := time.Duration(mrand.Int64N(int64(backoff))) + time.Millisecond
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, h.s.BackoffMax)
	}
}

// stream runs one stream: Hello, Welcome, then events out and commands in.
// done reports that the host finished on it (everything acknowledged).
func (h *host) stream(ctx context.Context) (welcomed, done bool, err error) {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+h.s.Token))
	defer cancel()
	stream, err := h.client.Connect(ctx)
	if err != nil {
		return false, false, err
	}
	h.mu.Lock()
	hello := &runnerv1.Hello{InstanceId: h.s.InstanceID, Launch: h.s.Launch, LinkId: h.linkID, LastCommandSeq: h.lastCmd,
		HeartbeatInterval: durationpb.New(h.s.Heartbeat), HostId: h.hostID}
	h.mu.Unlock()
	if err := stream.Send(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		_, err = stream.Recv() // the status says why
		return false, false, err
	}
	// Silence (no welcome, no heartbeat) for three intervals ends the stream.
	silence := time.AfterFunc(max(3*h.s.Heartbeat, HelloTimeout), cancel)
	defer silence.Stop()
	m, err := stream.Recv()
	if err != nil {
		return false, false, err
	}
	w := m.GetWelcome()
	if w == nil {
		return false, false, status.Error(codes.Internal, "the runner's first message was not a welcome")
	}
	silence.Reset(3 * h.s.Heartbeat)
	h.mu.Lock()
	if w.GetLinkId() != h.linkID {
		// A new link (a runner restart): its commands are numbered anew,
		// and it has not seen the session come up.
		if h.linkID != "" {
			go h.agent.resendReady(ctx)
			go h.resendPermissions(ctx)
		}
		h.linkID, h.lastCmd = w.GetLinkId(), 0
	}
	h.mu.Unlock()
	h.buf.ack(w.GetAckedSeq())
	h.welcomedOnce.Do(func() { close(h.welcomed) })

	sent := make(chan struct{})
	go func() {
		defer close(sent)
		_ = h.send(ctx, stream)
	}()
	defer func() { cancel(); <-sent }()
	for {
		m, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) && h.finished() {
				// Half-closed after the last ack: the runner ended the
				// stream in turn.
				return true, true, nil
			}
			return true, false, err
		}
		silence.Reset(3 * h.s.Heartbeat)
		switch k := m.GetMessage().(type) {
		case *runnerv1.ConnectResponse_EventAck:
			h.buf.ack(k.EventAck.GetSeq())
		case *runnerv1.ConnectResponse_Command:
			h.command(ctx, w.GetLinkId(), k.Command)
		case *runnerv1.ConnectResponse_Heartbeat:
		default:
			return true, false, status.Error(codes.Internal, "unexpected message from the runner")
		}
	}
}

// finished reports that the agent's exit is pushed and everything is
// acknowledged.
func (h *host) finished() bool {
	select {
	case <-h.finishing:
		n, _ := h.buf.pending()
		return n == 0
	default:
		return false
	}
}

// send streams the events not acknowledged (all of them again on a new
// stream), command acks and heartbeats. It half-closes the stream and
// returns nil once the host is finishing and everything is acknowledged.
func (h *host) send(ctx context.Context, stream grpc.BidiStreamingClient[runnerv1.ConnectRequest, runnerv1.ConnectResponse]) error {
	next := h.buf.firstSeq()
	var ackedCmd int64
	beat := time.NewTicker(h.s.Heartbeat)
	defer beat.Stop()
	for {
		events, changed := h.buf.from(next)
		for _, e := range events {
			if err := stream.Send(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_Event{Event: e}}); err != nil {
				return err
			}
			next = e.GetSeq() + 1
		}
		h.mu.Lock()
		cmd := h.lastCmd
		h.mu.Unlock()
		if cmd > ackedCmd {
			if err := stream.Send(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_CommandAck{CommandAck: &runnerv1.CommandAck{Seq: cmd}}}); err != nil {
				return err
			}
			ackedCmd = cmd
		}
		select {
		case <-h.finishing:
			if n, _ := h.buf.pending(); n == 0 {
				return stream.CloseSend()
			}
		default:
		}
		select {
		case <-changed:
		case <-h.cmdKick:
		case <-h.finishing:
			// Re-checked above once the buffer changes.
			select {
			case <-changed:
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-beat.C:
			if err := stream.Send(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_Heartbeat{Heartbeat: &runnerv1.Heartbeat{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// command applies one command of link linkID, once: commands are numbered
// per link, and a new link's numbering starts over.
func (h *host) command(ctx context.Context, linkID string, c *runnerv1.HostCommand) {
	h.mu.Lock()
	if linkID != h.linkID || c.GetSeq() <= h.lastCmd {
		h.mu.Unlock()
		return
	}
	h.lastCmd = c.GetSeq()
	a := h.agent
	h.mu.Unlock()
	switch k := c.GetKind().(type) {
	case *runnerv1.HostCommand_Prompt:
		a.prompt(ctx, k.Prompt)
	case *runnerv1.HostCommand_Cancel:
		a.cancel(ctx, k.Cancel)
	case *runnerv1.HostCommand_Close:
		a.close(ctx)
	case *runnerv1.HostCommand_PermissionAnswer:
		h.answered(k.PermissionAnswer)
	case *runnerv1.HostCommand_GatewayAccepted:
		if h.gateway != nil {
			h.gateway.accepted(k.GatewayAccepted)
		}
	case *runnerv1.HostCommand_GatewayTurnEnded:
		if h.gateway != nil {
			h.gateway.turnEnded(k.GatewayTurnEnded)
		}
	case *runnerv1.HostCommand_GatewayToolState:
		if h.gateway != nil {
			h.gateway.toolState(k.GatewayToolState)
		}
	}
	select {
	case h.cmdKick <- struct{}{}:
	default:
	}
}

// traceparent renders a span context as W3C traceparent, "" if invalid.
func traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"]
}
