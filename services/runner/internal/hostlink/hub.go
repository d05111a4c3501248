// Package hostlink is the link between the runner and agent-host, the
// entrypoint of an agent's Kubernetes pod: Hub is the runner's side (the
// gRPC service conclave.runner.v1.AgentHostService, and a Link per launch
// that the supervisor converses through), RunHost agent-host's (it runs the
// agent, speaks ACP to it with the runner's own client, and dials back).
// See docs/runner-kubernetes.md, "agent-host".
package hostlink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// HelloTimeout bounds how long a new stream may take to send its Hello.
const HelloTimeout = 10 * time.Second

// closeLinger is how long a closed link waits for its host to report that
// the agent exited before it is forgotten.
const closeLinger = time.Minute

// maxTombstones bounds the launches the hub remembers as closed, so that
// their hosts are told to stop rather than to retry.
const maxTombstones = 4096

// Hub is the runner's side of agent-host links: it serves
// AgentHostService and routes each host's stream to the Link its launch
// was expected with.
type Hub struct {
	runnerv1.UnimplementedAgentHostServiceServer
	key []byte
	log *slog.Logger

	mu    sync.Mutex
	links map[string]*Link
	// closed remembers launches closed or superseded (instance id, launch),
	// oldest first, so that their hosts are told to stop.
	closed     map[launchKey]string
	closedList []launchKey
	shutdown   bool
	streams    map[*hostStream]struct{}
	metrics    HubMetrics
}

// HubMetrics counts the hub's streams.
type HubMetrics interface {
	// HostConnect counts a Connect by outcome: accepted, unauthenticated,
	// no_hello, invalid, not_expected, refused or unavailable.
	HostConnect(outcome string)
	// HostStreams moves the gauge of streams attached to a link.
	HostStreams(delta int)
}

type noMetrics struct{}

func (noMetrics) HostConnect(string) {}
func (noMetrics) HostStreams(int)    {}

// SetMetrics makes the hub count its streams in m; call it before Register.
func (h *Hub) SetMetrics(m HubMetrics) { h.metrics = m }

type launchKey struct {
	instance string
	launch   int64
}

// NewHub makes a hub that accepts the tokens key signs (Token).
func NewHub(key []byte, logger *slog.Logger) *Hub {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Hub{key: key, log: logger, links: map[string]*Link{}, closed: map[launchKey]string{}, streams: map[*hostStream]struct{}{}, metrics: noMetrics{}}
}

// Register adds the service to a gRPC server.
func (h *Hub) Register(s grpc.ServiceRegistrar) { runnerv1.RegisterAgentHostServiceServer(s, h) }

// LinkOptions are a Link's receivers. Both run on the stream's receiving
// goroutine, in the order the host sent them, once per event even across
// reconnects; they must not block for long (the host buffers meanwhile).
type LinkOptions struct {
	OnUpdate func(ctx context.Context, u acp.Update)
	// OnLog gets the agent's stderr lines (stream "stderr") and
	// agent-host's notes (stream "host").
	OnLog func(stream, text string)
	// OnPermission decides the agent's permission requests under the
	// librarian policy; it may take as long as a person does (it runs on
	// a goroutine of its own, once per request). Nil refuses them.
	OnPermission func(ctx context.Context, req PermissionRequest) acp.PermissionAnswer
	// OnGatewayMessage stores a message that reached the agent at the
	// coven gateway, where agent-host registered it, as a turn of the
	// instance, calling accepted with the turn's number once stored and
	// before the turn's prompt is sent. It runs on a goroutine of its own.
	// Nil refuses such messages.
	OnGatewayMessage func(ctx context.Context, content string, accepted func(turn int)) error
	// OnGatewayCancel cancels the turn in progress, as the gateway asked.
	OnGatewayCancel func(reason string)
}

// PermissionRequest is a permission request agent-host relayed: the
// request's params as the agent sent them, and its workspace in the pod.
type PermissionRequest struct {
	Params    json.RawMessage
	Workspace string
	// Turn is the durable number of the turn that asks (0: none runs).
	Turn int64
}

// Expect registers launch of instanceID: its host's Connect is accepted
// from now on. A link already expected for the instance is superseded:
// it ends (its Done closes) and its host is told to stop, unless it is the
// same launch, whose host then moves to the new link.
func (h *Hub) Expect(instanceID string, launch int64, opts LinkOptions) *Link {
	if opts.OnUpdate == nil {
		opts.OnUpdate = func(context.Context, acp.Update) {}
	}
	if opts.OnLog == nil {
		opts.OnLog = func(string, string) {}
	}
	if opts.OnPermission == nil {
		opts.OnPermission = func(context.Context, PermissionRequest) acp.PermissionAnswer {
			return acp.PermissionAnswer{Meta: map[string]any{"decision": "unavailable", "reason": "the runner decides no permission requests for this launch"}}
		}
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	l := &Link{hub: h, instanceID: instanceID, launch: launch, id: hex.EncodeToString(b[:]), opts: opts, asking: map[permKey]bool{},
		readyCh: make(chan struct{}), done: make(chan struct{}), ended: map[int64]turnResult{}, waiters: map[int64][]chan turnResult{},
		prompted: map[int64]bool{}, applied: make(chan struct{})}
	h.mu.Lock()
	old := h.links[instanceID]
	h.links[instanceID] = l
	delete(h.closed, launchKey{instanceID, launch})
	h.mu.Unlock()
	if old != nil {
		if old.launch != launch {
			h.tombstone(old, fmt.Sprintf("launch %d superseded by launch %d", old.launch, launch))
		}
		old.end(errSuperseded, codes.Aborted, "the launch's link was replaced on the runner; reconnect")
	}
	return l
}

var errSuperseded = errors.New("hostlink: the link was superseded")

// forget drops l, if it is still its instance's link, without
// remembering its launch as closed.
func (h *Hub) forget(l *Link) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.links[l.instanceID] == l {
		delete(h.links, l.instanceID)
	}
}

// tombstone remembers l's launch as closed, with why.
func (h *Hub) tombstone(l *Link, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.links[l.instanceID] == l {
		delete(h.links, l.instanceID)
	}
	k := launchKey{l.instanceID, l.launch}
	if _, ok := h.closed[k]; !ok {
		h.closedList = append(h.closedList, k)
	}
	h.closed[k] = why
	for len(h.closedList) > maxTombstones {
		delete(h.closed, h.closedList[0])
		h.closedList = h.closedList[1:]
	}
}

// Shutdown ends every host stream with Unavailable, after what was sent on
// it, and refuses new ones, so that a gRPC server's GracefulStop can finish:
// the hosts buffer and reconnect to the runner that takes their launches
// over.
func (h *Hub) Shutdown() {
	h.mu.Lock()
	h.shutdown = true
	streams := make([]*hostStream, 0, len(h.streams))
	for s := range h.streams {
		streams = append(streams, s)
	}
	h.mu.Unlock()
	for _, s := range streams {
		s.stop(codes.Unavailable, "the runner is shutting down; reconnect")
	}
}

// Connect serves one host's stream.
func (h *Hub) Connect(stream grpc.BidiStreamingServer[runnerv1.ConnectRequest, runnerv1.ConnectResponse]) error {
	ctx := stream.Context()
	token := bearer(ctx)
	if token == "" {
		h.metrics.HostConnect("unauthenticated")
		return status.Error(codes.Unauthenticated, "missing authorization: Bearer <token>")
	}
	first, err := recvWithin(stream, HelloTimeout)
	if err != nil {
		h.metrics.HostConnect("no_hello")
		return err
	}
	hello, beat, err := checkHello(first)
	if err != nil {
		h.metrics.HostConnect("invalid")
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if !validToken(h.key, hello.GetInstanceId(), token) {
		h.metrics.HostConnect("unauthenticated")
		return status.Error(codes.Unauthenticated, "the token is not this instance's")
	}
	l, err := h.route(hello)
	if err != nil {
		if status.Code(err) == codes.NotFound {
			h.metrics.HostConnect("not_expected")
		} else {
			h.metrics.HostConnect("refused")
		}
		return err
	}
	s := &hostStream{link: l, stream: stream, kick: make(chan struct{}, 1), stopped: make(chan struct{})}
	h.mu.Lock()
	if h.shutdown {
		h.mu.Unlock()
		h.metrics.HostConnect("unavailable")
		return status.Error(codes.Unavailable, "the runner is shutting down; reconnect")
	}
	h.streams[s] = struct{}{}
	h.mu.Unlock()
	h.metrics.HostConnect("accepted")
	h.metrics.HostStreams(1)
	defer func() {
		h.mu.Lock()
		delete(h.streams, s)
		h.mu.Unlock()
		h.metrics.HostStreams(-1)
	}()
	acked := l.attach(s, hello)
	if err := stream.Send(&runnerv1.ConnectResponse{Message: &runnerv1.ConnectResponse_Welcome{Welcome: &runnerv1.Welcome{LinkId: l.id, AckedSeq: acked}}}); err != nil {
		l.detach(s)
		return err
	}
	h.log.InfoContext(ctx, "hostlink: agent-host connected", "instance_id", l.instanceID, "launch", l.launch, "host_id", hello.GetHostId())
	return s.serve(ctx, beat)
}

// route finds the link a Hello is for, or the status that turns it away.
func (h *Hub) route(hello *runnerv1.Hello) (*Link, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id, launch := hello.GetInstanceId(), hello.GetLaunch()
	if why, ok := h.closed[launchKey{id, launch}]; ok {
		return nil, status.Errorf(codes.PermissionDenied, "instance %s launch %d: %s; stop the agent", id, launch, why)
	}
	l := h.links[id]
	switch {
	case l == nil:
		return nil, status.Errorf(codes.NotFound, "instance %s launch %d is not expected on this runner (yet); retry", id, launch)
	case l.launch > launch:
		return nil, status.Errorf(codes.PermissionDenied, "instance %s launch %d is superseded by launch %d; stop the agent", id, launch, l.launch)
	case l.launch < launch:
		return nil, status.Errorf(codes.NotFound, "instance %s launch %d is not expected on this runner (yet: it expects launch %d); retry", id, launch, l.launch)
	}
	return l, nil
}

// recvWithin receives one message within d.
func recvWithin(stream grpc.BidiStreamingServer[runnerv1.ConnectRequest, runnerv1.ConnectResponse], d time.Duration) (*runnerv1.ConnectRequest, error) {
	type result struct {
		m   *runnerv1.ConnectRequest
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := stream.Recv()
		ch <- result{m, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-ch:
		if errors.Is(r.err, io.EOF) {
			return nil, status.Error(codes.InvalidArgument, "the stream ended before its hello")
		}
		return r.m, r.err
	case <-t.C:
		// Returning ends the stream, which ends the Recv.
		return nil, status.Errorf(codes.DeadlineExceeded, "no hello within %s", d)
	}
}

// hostStream is one host stream, attached to its link.
type hostStream struct {
	link   *Link
	stream grpc.BidiStreamingServer[runnerv1.ConnectRequest, runnerv1.ConnectResponse]
	// kick wakes the sender: something to send.
	kick chan struct{}

	stopOnce sync.Once
	stopped  chan struct{}
	stopErr  error
	// Under the link's mu: what was sent on this stream.
	sentCmd int64
	sentAck int64
	beatDue bool
}

func (s *hostStream) isStopped() bool {
	select {
	case <-s.stopped:
		return true
	default:
		return false
	}
}

func (s *hostStream) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// stop ends the stream with a status, once whatever was queued is sent.
func (s *hostStream) stop(code codes.Code, msg string) {
	s.stopOnce.Do(func() {
		s.stopErr = status.Error(code, msg)
		close(s.stopped)
	})
}

// serve runs the stream: a receiver (this goroutine's) and a sender.
func (s *hostStream) serve(ctx context.Context, beat time.Duration) error {
	l := s.link
	defer l.detach(s)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	received := make(chan struct{}, 1)
	recvErr := make(chan error, 1)
	// handling: an event is being handled, which may block (a slow
	// consumer); the host is not silent meanwhile, only unheard.
	var handling atomic.Bool
	go func() {
		for {
			m, err := s.stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			handling.Store(true)
			err = l.handle(ctx, s, m)
			handling.Store(false)
			select {
			case received <- struct{}{}:
			default:
			}
			if err != nil {
				recvErr <- err
				return
			}
		}
	}()
	silence := time.NewTimer(3 * beat)
	defer silence.Stop()
	ticker := time.NewTicker(beat)
	defer ticker.Stop()
	for {
		if err := s.flush(); err != nil {
			return err
		}
		select {
		case <-s.kick:
		case <-received:
			silence.Reset(3 * beat)
		case <-ticker.C:
			l.mu.Lock()
			s.beatDue = true
			l.mu.Unlock()
		case <-silence.C:
			if handling.Load() {
				silence.Reset(3 * beat)
				continue
			}
			return status.Errorf(codes.DeadlineExceeded, "agent-host silent for %s", 3*beat)
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				// The host closed its side: it is done (it exits once its
				// last event is acknowledged, which flush has sent).
				return s.flush()
			}
			return err
		case <-s.stopped:
			// The event being handled, if any, is taken and acknowledged;
			// none after it is (handle checks stopped), so the host re-sends
			// exactly what this runner did not take.
			l.waitEventInProgress()
			if err := s.flush(); err != nil {
				return err
			}
			return s.stopErr
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// flush sends what is due: the event ack, commands not yet sent on this
// stream, a heartbeat.
func (s *hostStream) flush() error {
	l := s.link
	l.mu.Lock()
	var out []*runnerv1.ConnectResponse
	if l.acked > s.sentAck {
		out = append(out, &runnerv1.ConnectResponse{Message: &runnerv1.ConnectResponse_EventAck{EventAck: &runnerv1.EventAck{Seq: l.acked}}})
		s.sentAck = l.acked
	}
	for _, c := range l.commands {
		if c.GetSeq() > s.sentCmd {
			out = append(out, &runnerv1.ConnectResponse{Message: &runnerv1.ConnectResponse_Command{Command: c}})
			s.sentCmd = c.GetSeq()
		}
	}
	if s.beatDue {
		out = append(out, &runnerv1.ConnectResponse{Message: &runnerv1.ConnectResponse_Heartbeat{Heartbeat: &runnerv1.Heartbeat{}}})
		s.beatDue = false
	}
	l.mu.Unlock()
	for _, m := range out {
		if err := s.stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// traceContext is ctx with the span context of a W3C traceparent.
func traceContext(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

func statusInvalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

func statusAborted(msg string) error { return status.Error(codes.Aborted, msg) }
