// Package supervisor runs launches: it consumes the launch queue with a pool
// of workers, starts each agent through an executor, drives it with the ACP
// client, and records its status, logs and events.
package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/covenlink"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// Errors the API maps to its codes.
var (
	// ErrBusy: a turn is in progress, or the instance is still starting.
	ErrBusy = errors.New("busy")
	// ErrFinished: the instance can no longer do what was asked.
	ErrFinished = errors.New("finished")
)

// Options configure a Supervisor.
type Options struct {
	Records  *records.Records
	Queue    queue.Queue
	Registry *agenttype.Registry
	Executor executor.Executor
	// LaunchQueue and EventsQueue name the queues.
	LaunchQueue, EventsQueue string
	// Workers bounds the agents running at once on this replica.
	Workers int
	// Visibility is how long a launch stays hidden from other workers
	// without its worker renewing it: how soon a crashed runner's launches
	// are retried.
	Visibility time.Duration
	// ProtocolTimeout bounds initialize, session/new and session/load, and
	// a kandev agent's accepting a prompt: a live process silent that long
	// has a dead protocol.
	ProtocolTimeout time.Duration
	// SilenceTimeout is how long an agent may send nothing in the middle of
	// a turn before its protocol is dead, unless its type sets its own.
	SilenceTimeout time.Duration
	// CancelGrace is how long a turn may take to end after session/cancel
	// before the process is killed.
	CancelGrace time.Duration
	// IdleTimeout is how long an agent with no turn in progress is kept for
	// further prompts; a later prompt resumes the session in a new process.
	IdleTimeout time.Duration
	// MaxLine bounds a line from an agent.
	MaxLine int
	// Hosts, when set, runs every agent behind agent-host (the Kubernetes
	// executor). HostStartTimeout bounds a launch's wait for agent-host's
	// handshake (its pod being scheduled and its image started count);
	// HostExitGrace is how long its Job may take to finish once agent-host
	// is told to end before it is deleted.
	Hosts HostLinks
	// Gateway, when set, registers the agents whose type or launch asks
	// for it at the coven gateway; GatewayHost is where they run, as the
	// gateway lists them (this replica's name).
	Gateway     *covenlink.Registrar
	GatewayHost string
	// HostGateway: agent-host registers the agents behind it that are on
	// the gateway itself, from where they run (the runner gives it the
	// gateway's address and token); the runner registers none of them.
	HostGateway      bool
	HostStartTimeout time.Duration
	HostExitGrace    time.Duration
	Source           string
	Logger           *slog.Logger
	// TracerProvider makes the workers' consumer spans.
	TracerProvider trace.TracerProvider
	Metrics        Metrics
	// Governor decides the permission requests of agent types under the
	// librarian policy (nil: they are refused, failing closed).
	Governor Governor
	// BeforeEventSend, when set, sees each envelope before it is sent (a
	// test's crash point).
	BeforeEventSend func(*eventsv1.Envelope)
}

// Metrics is told of what the supervisor does.
type Metrics interface {
	Launch(outcome string)
	Update(kind string)
	Drop(reason string)
	Status(status string)
	Events(n int)
	Running(delta int)
}

// Supervisor runs launches.
type Supervisor struct {
	o      Options
	log    *slog.Logger
	logs   *logBook
	events *events
	tracer trace.Tracer

	mu       sync.Mutex
	sessions map[string]*session
	// writing holds the instances whose first write is in progress beside
	// their launch's enqueue, each closed when the write has ended.
	writing  map[string]chan struct{}
	stopping chan struct{}
	stopOnce sync.Once
	owner    atomic.Pointer[string]
}

// New returns a supervisor; Run starts its workers.
func New(o Options) *Supervisor {
	s := &Supervisor{o: o, log: o.Logger, sessions: map[string]*session{}, writing: map[string]chan struct{}{}, stopping: make(chan struct{})}
	s.logs = newLogBook(o.Records, o.Logger)
	s.events = newEvents(o.Queue, o.EventsQueue, o.Source, o.Logger, o.Metrics.Events)
	s.events.hold = o.BeforeEventSend
	tp := o.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	s.tracer = tp.Tracer("conclave-runner")
	return s
}

// launchMessage is a launch on the queue.
type launchMessage struct {
	InstanceID string `json:"instance_id"`
	Seq        int    `json:"seq"`
}

// instanceWriteGrace is how long after it was sent a launch whose write is
// not in the store is tried again rather than dropped: the write may still
// be in progress on another replica (a launch is queued before it is
// written).
const instanceWriteGrace = time.Minute

// errNotWrittenYet leaves a launch on the queue until its instance is written.
var errNotWrittenYet = errors.New("the launch is not written yet; it will be retried")

// notWrittenRetry is when a launch received before its write is tried
// again: after 1 s, then 2, 4, 8, 16 and 30 s. Doubling keeps a launch
// whose write never lands to 7 receives over instanceWriteGrace, under the
// launch queue's 10 before its dead-letter queue.
func notWrittenRetry(receiveCount int) time.Duration {
	return min(time.Second<<min(max(receiveCount-1, 0), 5), 30*time.Second)
}

// writingBeside registers a write of the instance in progress beside its
// launch message, for awaitWrite; the returned func ends it.
func (s *Supervisor) writingBeside(instanceID string) func() {
	written := make(chan struct{})
	s.mu.Lock()
	s.writing[instanceID] = written
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.writing, instanceID)
		s.mu.Unlock()
		close(written)
	}
}

// awaitWrite waits for a write of the instance beside its launch message,
// if one is in progress here, and reports whether there was one.
func (s *Supervisor) awaitWrite(ctx context.Context, instanceID string) bool {
	s.mu.Lock()
	written := s.writing[instanceID]
	s.mu.Unlock()
	if written == nil {
		return false
	}
	select {
	case <-written:
	case <-ctx.Done():
	}
	return true
}

// Owner is the address other replicas reach this one at, once Run has it.
func (s *Supervisor) Owner() string {
	if p := s.owner.Load(); p != nil {
		return *p
	}
	return ""
}

// Run consumes launches until ctx ends, then stops the agents it runs:
// their launches go back on the queue for the next runner. owner is the
// address other replicas forward this replica's instances' requests to; it
// is recorded on each launch claimed.
func (s *Supervisor) Run(ctx context.Context, owner string) error {
	s.owner.Store(&owner)
	go func() {
		<-ctx.Done()
		s.stopOnce.Do(func() { close(s.stopping) })
	}()
	err := queue.Consume(ctx, newLanes(s.o.Queue, s.o.LaunchQueue, s.log), s.o.LaunchQueue, s.handle, queue.ConsumerOptions{
		Workers: s.o.Workers, Visibility: s.o.Visibility, Logger: s.log, TracerProvider: s.o.TracerProvider})
	flush, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.events.Close(flush)
	return err
}

// Logs is the log book, for the API.
func (s *Supervisor) Logs() *logBook { return s.logs }

func (s *Supervisor) session(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

// errStopping leaves a launch on the queue for the next runner.
var errStopping = errors.New("runner shutting down; the launch will be retried")

// errDuplicate: the launch is done, superseded, or run by another delivery.
var errDuplicate = errors.New("duplicate launch")

// errRunningHere and errOlderReceipt leave a message on the queue: it is
// the very message a session runs, received again, and deleting it under
// an older receipt than the one its session holds could lose it.
var (
	errRunningHere  = errors.New("its session runs on this runner; the message stays queued")
	errOlderReceipt = errors.New("a later receipt of the same message runs it; the message stays queued")
)

// stale reports why a launch message for in is not to be run, if it is not.
func stale(in *records.Instance, seq int) bool {
	return in.Deleted || seq <= in.DoneSeq || seq < in.LaunchSeq
}

func (s *Supervisor) handle(ctx context.Context, m queue.Message) error {
	var msg launchMessage
	if err := json.Unmarshal(m.Body, &msg); err != nil || msg.InstanceID == "" || msg.Seq < 1 {
		s.log.WarnContext(ctx, "runner: dropping an unreadable launch", "message_id", m.ID, "error", err)
		s.o.Metrics.Launch("unreadable")
		return nil
	}
	waited := s.awaitWrite(ctx, msg.InstanceID)
	in, err := s.o.Records.Instance(ctx, msg.InstanceID)
	if errors.Is(err, records.ErrNotFound) || err == nil && msg.Seq > in.LaunchSeq && !stale(in, msg.Seq) {
		// Queued before its write, which has not landed (or failed).
		if !waited && time.Since(m.SentAt) < instanceWriteGrace {
			// Back in a second or so, not at the launch retry's
			// visibility (30 s): with several replicas, another one's
			// worker often takes a launch the moment it is queued,
			// milliseconds before its write lands.
			return queue.RetryAfter(fmt.Errorf("launch %d of instance %s: %w", msg.Seq, msg.InstanceID, errNotWrittenYet),
				notWrittenRetry(m.ReceiveCount))
		}
		s.o.Metrics.Launch("gone")
		return nil
	}
	if err != nil {
		return err
	}
	if stale(in, msg.Seq) {
		s.o.Metrics.Launch("duplicate")
		// Its events may not all have been sent: the runner that ran it
		// may have died after recording its end.
		return s.drainOutbox(ctx, in.ID)
	}
	if live := s.session(in.ID); live != nil {
		if live.seq == msg.Seq && live.claimMsg == m.ID {
			// The same message again (its visibility lapsed while its
			// session runs here): deleting it under this receipt would
			// leave nothing to redeliver should this runner stop.
			return fmt.Errorf("launch %d of instance %s: %w", msg.Seq, in.ID, errRunningHere)
		}
		if live.seq == msg.Seq {
			s.o.Metrics.Launch("duplicate")
			return nil
		}
		// The instance's previous launch is still ending here.
		select {
		case <-live.done:
		case <-ctx.Done():
			return errStopping
		}
		return s.handle(ctx, m)
	}
	// Events a runner that died left unsent go out before the new ones.
	s.resendOrphans(ctx, in)
	sess := newSession(s, in, m, msg.Seq)
	s.mu.Lock()
	if s.sessions[in.ID] != nil {
		s.mu.Unlock()
		return s.handle(ctx, m)
	}
	s.sessions[in.ID] = sess
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sessions, in.ID)
		s.mu.Unlock()
		close(sess.done)
	}()
	// The claim is written while the agent's process starts (see
	// session.run).
	claim := s.claim(ctx, in.ID, msg.Seq, m)
	if m.ReceiveCount > 1 {
		s.log.InfoContext(ctx, "runner: retrying a launch whose runner stopped", "instance_id", in.ID, "attempt", m.ReceiveCount)
	}
	s.o.Metrics.Running(1)
	defer s.o.Metrics.Running(-1)
	switch err := sess.run(ctx, in, claim); {
	case errors.Is(err, errDuplicate):
		s.o.Metrics.Launch("duplicate")
		return nil
	case err != nil:
		return err
	}
	// The launch's message is deleted only once the events of its status
	// changes are on the events queue.
	if err := s.drainOutbox(context.WithoutCancel(ctx), in.ID); err != nil {
		return err
	}
	// A prompt accepted as the agent went away: resume the session for it.
	if in, err := s.o.Records.Instance(context.WithoutCancel(ctx), in.ID); err == nil && in.PendingTurn() && !in.Launching() && !in.Deleted {
		if err := s.resume(context.WithoutCancel(ctx), in, nil); err != nil {
			s.log.WarnContext(ctx, "runner: resuming for a prompt that arrived as the agent exited", "instance_id", in.ID, "error", err)
		}
	}
	return nil
}

// claimResult is how a launch's claim ended: the instance as claimed, or
// errDuplicate (another delivery has it), or a store error.
type claimResult struct {
	in  *records.Instance
	err error
}

// claim writes, in the background, the claim of launch seq of an instance
// for its delivery m: the claim makes one delivery run the launch,
// wherever its duplicates go. How the write ended arrives on the channel
// returned.
func (s *Supervisor) claim(ctx context.Context, instanceID string, seq int, m queue.Message) <-chan claimResult {
	claim := make(chan claimResult, 1)
	go func() {
		claimed, err := s.o.Records.UpdateInstance(ctx, instanceID, func(in *records.Instance) error {
			switch {
			case stale(in, seq) || in.ClaimSeq == seq && in.ClaimMsg != "" && in.ClaimMsg != m.ID:
				return errDuplicate
			case in.ClaimSeq == seq && in.ClaimMsg == m.ID && m.ReceiveCount <= in.ClaimRecv:
				return errOlderReceipt
			}
			in.ClaimSeq, in.ClaimMsg, in.ClaimRecv, in.Owner = seq, m.ID, m.ReceiveCount, s.Owner()
			return nil
		})
		if errors.Is(err, records.ErrNotFound) {
			err = errDuplicate
		}
		claim <- claimResult{claimed, err}
	}()
	return claim
}

// Live reports whether this replica runs a process for the instance.
func (s *Supervisor) Live(id string) bool { return s.session(id) != nil }
