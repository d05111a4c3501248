// Package supervisor runs launches: it consumes the launch queue with a pool
// of workers, starts each agent through an executor, drives it with the ACP
// client, and records its status, logs and events.
package supervisor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conclave-ai/conclave/pkg/queue"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
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
	Hosts            HostLinks
	HostStartTimeout time.Duration
	HostExitGrace    time.Duration
	Source           string
	Logger           *slog.Logger
	// TracerProvider makes the workers' consumer spans.
	TracerProvider trace.TracerProvider
	Metrics        Metrics
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

// ErrElsewhere is wrapped by errors for an instance whose launch another
// replica runs; Owner says which.
type ErrElsewhere struct{ Owner string }

func (e *ErrElsewhere) Error() string { return "the instance runs on runner " + e.Owner }

// Launch queues an instance's first launch and then writes the instance
// with write. The queueing comes first so that no acknowledged instance is
// ever left without its launch (a runner dying between the two leaves at
// most a message for an instance never written, which is dropped). The
// caller answers only once both have succeeded. A worker of this replica
// that receives the launch before the write ends waits for it; see handle
// for other replicas.
//
// The instance's first status, starting, is announced like every status
// change: its event goes in the instance's outbox, so write must write in
// as it is once Launch has added it.
func (s *Supervisor) Launch(ctx context.Context, in *records.Instance, write func(context.Context) error) error {
	defer s.writingBeside(in.ID)()
	if err := s.Enqueue(ctx, in.ID, 1, in.Priority); err != nil {
		return err
	}
	ev := s.events.prepare(ctx, EventStatusChanged, in.TaskID, in.ID, statusPayload(in))
	in.Outbox = nil
	in.AddToOutbox(ev)
	if err := write(ctx); err != nil {
		return err
	}
	s.announce(ctx, &ev, in.Status)
	s.clearOnceSent(in.ID, ev.ID)
	return nil
}

// clearOnceSent removes an event that a request (not a launch's session)
// wrote in an instance's outbox once it is sent, so that the runner that
// runs the launch (maybe another replica) does not send it again. A runner
// that dies first leaves it for the launch's end.
func (s *Supervisor) clearOnceSent(instanceID, eventID string) {
	seq, ok := s.events.Tracked(eventID)
	if !ok {
		return
	}
	go func() {
		// Past its patience the event stays in the outbox, for the
		// launch's end to send.
		if !s.events.waitSent(seq, s.stopping, s.eventsPatience()) || !s.events.Sent(eventID) {
			return
		}
		_, err := s.o.Records.UpdateInstance(context.Background(), instanceID, func(in *records.Instance) error {
			kept := slices.DeleteFunc(slices.Clone(in.Outbox), func(ev records.OutboxEvent) bool { return ev.ID == eventID })
			if len(kept) == len(in.Outbox) {
				return errOutboxUnchanged
			}
			in.Outbox = kept
			return nil
		})
		if err != nil && !errors.Is(err, errOutboxUnchanged) && !errors.Is(err, records.ErrNotFound) {
			s.log.Warn("runner: clearing a sent event from an instance's outbox", "instance_id", instanceID, "error", err)
		}
	}()
}

// resendOrphans sends again, before a launch starts, the events of its
// instance's outbox that this runner does not know of and that are older
// than the outbox grace: left unsent by a runner that died (younger ones
// are most likely being sent by the replica that wrote them, and the
// launch's end sends whatever is left). They go out ahead of the launch's
// own events.
func (s *Supervisor) resendOrphans(ctx context.Context, in *records.Instance) {
	grace := max(s.o.Visibility/4, 250*time.Millisecond)
	resent := 0
	for _, ev := range in.Outbox {
		if _, tracked := s.events.Tracked(ev.ID); tracked || s.events.Sent(ev.ID) || time.Since(ev.Time) < grace {
			continue
		}
		s.events.PublishOutbox(ctx, ev)
		resent++
	}
	s.noteResent(ctx, in.ID, resent)
}

// noteResent logs events sent again for an instance, in its log too.
func (s *Supervisor) noteResent(ctx context.Context, id string, n int) {
	if n == 0 {
		return
	}
	s.log.InfoContext(ctx, "runner: sending events a runner left unsent", "instance_id", id, "events", n)
	l := s.logs.open(ctx, id)
	l.Add(StreamRunner, fmt.Sprintf("events: sent %d status event(s) again that a runner had left unsent", n))
	l.Close()
}

// withStatusEvent wraps a write of an instance so that a change of status
// it makes is announced by an event written in the instance's outbox by
// the same write; *ev is set to that event, nil when there is none. With
// planned set, that event (announced already) is the one written, if the
// write changes anything; events the outbox holds that were sent are
// dropped from it.
func (s *Supervisor) withStatusEvent(ctx context.Context, fn func(*records.Instance) error, planned *records.OutboxEvent, ev **records.OutboxEvent) func(*records.Instance) error {
	return func(in *records.Instance) error {
		*ev = nil
		prev := in.Status
		if err := fn(in); err != nil {
			return err
		}
		in.Outbox = s.events.Unsent(in.Outbox)
		switch {
		case planned != nil:
			*ev = planned
		case in.Status != prev:
			e := s.events.prepare(ctx, EventStatusChanged, in.TaskID, in.ID, statusPayload(in))
			*ev = &e
		default:
			return nil
		}
		if n := in.AddToOutbox(**ev); n > 0 {
			s.log.WarnContext(ctx, "runner: an instance's event outbox is full; its oldest events were dropped", "instance_id", in.ID, "dropped", n)
		}
		return nil
	}
}

// announce publishes a status change's event (nil: none), written in its
// instance's outbox.
func (s *Supervisor) announce(ctx context.Context, ev *records.OutboxEvent, status string) {
	if ev == nil {
		return
	}
	s.o.Metrics.Status(status)
	s.events.PublishOutbox(ctx, *ev)
}

// errOutboxUnchanged ends a write that would change nothing.
var errOutboxUnchanged = errors.New("outbox unchanged")

// drainOutbox makes sure every event in the instance's outbox is on the
// events queue, and then removes them from it: those published here are
// waited for, and those this runner does not know of (left by a runner
// that died before sending them, or by another replica) are sent again,
// under their own ids. It runs before a launch message is deleted, so a
// crash anywhere before it leaves the message, whose next delivery drains
// the outbox again. It fails with errStopping when the runner stops first,
// and with errEventsPending when the events cannot be sent in time.
func (s *Supervisor) drainOutbox(ctx context.Context, id string) error {
	in, err := s.o.Records.Instance(ctx, id)
	if errors.Is(err, records.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(in.Outbox) == 0 {
		return nil
	}
	var last uint64
	resent := 0
	for _, ev := range in.Outbox {
		if s.events.Sent(ev.ID) {
			continue
		}
		seq, ok := s.events.Tracked(ev.ID)
		if !ok {
			seq = s.events.PublishOutbox(ctx, ev)
			resent++
		}
		last = max(last, seq)
	}
	s.noteResent(ctx, id, resent)
	if !s.events.waitSent(last, s.stopping, s.eventsPatience()) {
		select {
		case <-s.stopping:
			return errStopping
		default:
			// The events queue is failing: free the worker, and leave the
			// message for a later delivery to drain the outbox again.
			return fmt.Errorf("instance %s: %w", id, errEventsPending)
		}
	}
	_, err = s.o.Records.UpdateInstance(ctx, id, func(in *records.Instance) error {
		unsent := s.events.Unsent(in.Outbox)
		if len(unsent) == len(in.Outbox) {
			return errOutboxUnchanged
		}
		in.Outbox = unsent
		return nil
	})
	switch {
	case err == nil, errors.Is(err, errOutboxUnchanged), errors.Is(err, records.ErrNotFound):
		return nil
	}
	return err
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

// errSessionEnding is a live session's refusal of a prompt as it ends;
// Prompt waits for the end and resumes the session for the prompt.
var errSessionEnding = fmt.Errorf("the agent is stopping; retry to resume it: %w", ErrBusy)

func (s *Supervisor) session(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

// errEventsPending leaves a launch on the queue while the events of its
// status changes cannot be sent: its next delivery drains the outbox again.
var errEventsPending = errors.New("the launch's events are not on the events queue yet; the launch will be retried")

// eventsPatience is how long a worker waits for a launch's events to be
// sent before it leaves the launch for a later delivery, well within the
// launch message's visibility so that no other runner takes it meanwhile.
func (s *Supervisor) eventsPatience() time.Duration {
	return max(s.o.Visibility/2, time.Second)
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
	// The claim: one delivery runs the launch, wherever its duplicates go.
	// It is written while the agent's process starts (see session.run).
	claim := make(chan claimResult, 1)
	go func() {
		claimed, err := s.o.Records.UpdateInstance(ctx, in.ID, func(in *records.Instance) error {
			switch {
			case stale(in, msg.Seq) || in.ClaimSeq == msg.Seq && in.ClaimMsg != "" && in.ClaimMsg != m.ID:
				return errDuplicate
			case in.ClaimSeq == msg.Seq && in.ClaimMsg == m.ID && m.ReceiveCount <= in.ClaimRecv:
				return errOlderReceipt
			}
			in.ClaimSeq, in.ClaimMsg, in.ClaimRecv, in.Owner = msg.Seq, m.ID, m.ReceiveCount, s.Owner()
			return nil
		})
		if errors.Is(err, records.ErrNotFound) {
			err = errDuplicate
		}
		claim <- claimResult{claimed, err}
	}()
	if m.ReceiveCount > 1 {
		s.log.InfoContext(ctx, "runner: retrying a launch whose runner stopped", "instance_id", in.ID, "attempt", m.ReceiveCount)
	}
	s.o.Metrics.Running(1)
	defer s.o.Metrics.Running(-1)
	switch err := sess.run(ctx, in, m, claim); {
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

// Prompt sends a prompt to an instance: to its live agent if it is idle, or
// by resuming the session in a new process if the agent is gone. The
// prompt is stored before Prompt returns, so that a runner dying later
// does not lose it.
func (s *Supervisor) Prompt(ctx context.Context, id, message string) error {
	if live := s.session(id); live != nil {
		err := live.prompt(ctx, message)
		if !errors.Is(err, errSessionEnding) {
			return err
		}
		// The agent is going away (its turn ended and it idled out, or it
		// was cancelled): once its launch has ended, the prompt resumes the
		// session, rather than telling the caller to come back.
		select {
		case <-live.done:
		case <-ctx.Done():
			return err
		}
		return s.Prompt(ctx, id, message)
	}
	in, err := s.o.Records.Instance(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case in.Deleted:
		return fmt.Errorf("instance %s is being deleted: %w", id, ErrFinished)
	case s.RemoteOwner(in) != "":
		return fmt.Errorf("prompt: %w", &ErrElsewhere{Owner: in.Owner})
	case in.PendingTurn() && !in.Launching():
		// A prompt stored as its agent went away whose resumption failed:
		// resume it now, and this one waits its turn.
		if err := s.resume(ctx, in, nil); err != nil {
			return err
		}
		return fmt.Errorf("instance %s has a prompt waiting; resuming for it: %w", id, ErrBusy)
	case in.Launching() || in.PendingTurn():
		return fmt.Errorf("instance %s is %s; wait for its turn to end: %w", id, in.Status, ErrBusy)
	}
	return s.resume(ctx, in, &message)
}

// resume queues a new launch of in, for a new prompt (message) or for the
// one pending (nil). The message goes first and the write after, as in
// Launch; a write that loses to another one leaves a message that is
// dropped.
func (s *Supervisor) resume(ctx context.Context, in *records.Instance, message *string) error {
	seq := in.LaunchSeq + 1
	defer s.writingBeside(in.ID)()
	if err := s.Enqueue(ctx, in.ID, seq, in.Priority); err != nil {
		return err
	}
	var ev *records.OutboxEvent
	in, err := s.o.Records.UpdateInstance(ctx, in.ID, s.withStatusEvent(ctx, func(cur *records.Instance) error {
		switch {
		case cur.Deleted:
			return fmt.Errorf("instance %s is being deleted: %w", cur.ID, ErrFinished)
		case cur.LaunchSeq+1 != seq || cur.Launching() || message != nil && cur.PendingTurn():
			return fmt.Errorf("instance %s is %s; wait for its turn to end: %w", cur.ID, cur.Status, ErrBusy)
		}
		cur.LaunchSeq = seq
		if message != nil {
			cur.Turn, cur.Prompt = cur.Turn+1, *message
		}
		cur.Status, cur.Progress, cur.FinishedAt, cur.Error = records.StatusStarting, 0, time.Time{}, ""
		return nil
	}, nil, &ev))
	if err != nil {
		return err
	}
	s.announce(ctx, ev, in.Status)
	if ev != nil {
		s.clearOnceSent(in.ID, ev.ID)
	}
	return nil
}

// Cancel ends an instance's turn: session/cancel to a live agent (killed
// if it has not stopped after the grace period), or ending a launch still
// queued, or one whose runner is gone, stopped.
func (s *Supervisor) Cancel(ctx context.Context, id, reason string) (*records.Instance, error) {
	return s.cancel(ctx, id, reason, true)
}

// cancel routes a cancel; routeAgain lets a launch claimed between the read
// and the write be routed once more, to its session or its owner.
func (s *Supervisor) cancel(ctx context.Context, id, reason string, routeAgain bool) (*records.Instance, error) {
	if live := s.session(id); live != nil {
		live.cancel(reason)
		return s.o.Records.Instance(ctx, id)
	}
	cur, err := s.o.Records.Instance(ctx, id)
	if err != nil {
		return nil, err
	}
	if owner := s.RemoteOwner(cur); owner != "" {
		return nil, fmt.Errorf("cancel: %w", &ErrElsewhere{Owner: owner})
	}
	return s.cancelStored(ctx, id, reason, routeAgain)
}

// CancelStored cancels in the store alone, for an instance no runner can be
// reached for: a launch not yet claimed ends stopped; one claimed by a
// runner that is gone has its pending turn marked cancelled, so that the
// delivery that takes it over ends the turn rather than running it; a
// pending turn with no launch (its resumption failed) ends stopped.
func (s *Supervisor) CancelStored(ctx context.Context, id, reason string) (*records.Instance, error) {
	return s.cancelStored(ctx, id, reason, false)
}

// errClaimedMeanwhile sends a cancel back to routing: the launch was
// claimed between the routing's read and the cancel's write.
var errClaimedMeanwhile = errors.New("claimed meanwhile")

func (s *Supervisor) cancelStored(ctx context.Context, id, reason string, unclaimedOnly bool) (*records.Instance, error) {
	changed := false
	var ev *records.OutboxEvent
	in, err := s.o.Records.UpdateInstance(ctx, id, s.withStatusEvent(ctx, func(in *records.Instance) error {
		queued := in.Launching() && in.ClaimSeq != in.LaunchSeq
		stranded := !in.Launching() && in.PendingTurn()
		if unclaimedOnly && in.Launching() && !queued {
			return errClaimedMeanwhile
		}
		if changed = queued || in.PendingTurn(); !changed {
			return nil
		}
		if in.PendingTurn() {
			in.CancelTurn = in.Turn
		}
		in.Status, in.FinishedAt, in.Error = records.StatusStopped, time.Now().UTC(), "cancelled: "+reason
		if queued || stranded {
			// Nothing runs it: the turn ends here, and a queued message
			// is dropped as done.
			in.DoneSeq, in.TurnDone, in.Prompt, in.CancelTurn = in.LaunchSeq, in.Turn, "", 0
		}
		return nil
	}, nil, &ev))
	if errors.Is(err, errClaimedMeanwhile) {
		return s.cancel(ctx, id, reason, false)
	}
	if err == nil && changed {
		s.announce(ctx, ev, in.Status)
		if ev != nil {
			s.clearOnceSent(in.ID, ev.ID)
		}
	}
	return in, err
}

// RemoteOwner is the replica running in's launch, if that is not this one.
func (s *Supervisor) RemoteOwner(in *records.Instance) string {
	if in.Launching() && in.ClaimSeq == in.LaunchSeq && in.Owner != "" && in.Owner != s.Owner() && s.session(in.ID) == nil {
		return in.Owner
	}
	return ""
}

// Delete kills an instance's agent, if this replica runs it, and removes
// its records. An agent run by another replica stops at its next write,
// which finds no instance; the API asks that replica to delete instead
// (RemoteOwner), so that its agent stops at once.
func (s *Supervisor) Delete(ctx context.Context, id string) error {
	if _, err := s.o.Records.UpdateInstance(ctx, id, func(in *records.Instance) error {
		in.Deleted = true
		return nil
	}); err != nil {
		return err
	}
	if live := s.session(id); live != nil {
		live.kill(stopDeleted, "deleted")
		select {
		case <-live.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.o.Records.DeleteInstance(ctx, id)
}

func statusPayload(in *records.Instance) map[string]any {
	p := map[string]any{"instance_id": in.ID, "task_id": in.TaskID, "agent_type": in.AgentType, "status": in.Status, "progress": float64(in.Progress)}
	if in.Error != "" {
		p["error"] = in.Error
	}
	return p
}

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

// pendingPrompt is an accepted prompt: its turn number and message.
type pendingPrompt struct {
	turn    int
	message string
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
}

func newSession(s *Supervisor, in *records.Instance, m queue.Message, seq int) *session {
	return &session{s: s, seq: seq, launch: *in, in: in, claimMsg: m.ID, claimRecv: m.ReceiveCount,
		prompts: make(chan pendingPrompt, 1), done: make(chan struct{})}
}

// errClaimLost fences a session whose launch another delivery took over.
var errClaimLost = errors.New("the launch was taken over by another delivery")

// prompt stores a prompt for the live agent and hands it over.
func (ss *session) prompt(ctx context.Context, message string) error {
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
	ss.prompts <- pendingPrompt{turn: in.Turn, message: message}
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

// update applies fn to the stored instance, fenced by the session's claim,
// records the result and announces a change of status.
func (ss *session) update(ctx context.Context, fn func(in *records.Instance) error) (*records.Instance, error) {
	ss.stMu.Lock()
	in, ev, err := ss.write(ctx, fn, nil)
	if err == nil {
		ss.in = in
	}
	ss.stMu.Unlock()
	if err != nil {
		return nil, err
	}
	ss.announce(ctx, in, ev)
	return in, nil
}

// probe applies fn to a copy of the instance as last written, and reports
// whether it changes nothing: such a change costs no write, each being a
// durable commit. Call with stMu held.
func (ss *session) probe(fn func(in *records.Instance)) (*records.Instance, bool) {
	probe := *ss.in
	fn(&probe)
	return &probe, reflect.DeepEqual(&probe, ss.in)
}

// setStatus records a status change and sends its event, once the change
// is written. A failed write is logged.
func (ss *session) setStatus(ctx context.Context, fn func(in *records.Instance)) {
	ss.stMu.Lock()
	probe, unchanged := ss.probe(fn)
	if unchanged {
		ss.stMu.Unlock()
		return
	}
	if probe.Terminal() && ss.log != nil {
		// A client that sees the turn end reads all of its lines.
		ss.log.Sync(ctx)
	}
	in, ev, err := ss.write(ctx, func(in *records.Instance) error { fn(in); return nil }, nil)
	if err == nil {
		ss.in = in
	}
	ss.stMu.Unlock()
	if err == nil {
		ss.announce(ctx, in, ev)
	}
}

// setStatusBeside records a status change like setStatus, but sends its
// event (and log line) at once and leaves the write in progress, for a
// change that what follows need not wait on: the start of a turn, whose
// prompt goes to the agent while the write commits. The write holds stMu,
// so later changes, and reads of ss.in, wait for it and stay in order. A
// runner that dies before it commits loses nothing: the launch is not done
// in the store, so its message is delivered again.
func (ss *session) setStatusBeside(ctx context.Context, fn func(in *records.Instance)) {
	ss.stMu.Lock()
	probe, unchanged := ss.probe(fn)
	if unchanged {
		ss.stMu.Unlock()
		return
	}
	var planned *records.OutboxEvent
	if probe.Status != ss.in.Status {
		ev := ss.s.events.prepare(ctx, EventStatusChanged, probe.TaskID, probe.ID, statusPayload(probe))
		planned = &ev
	}
	ss.statusWrites.Add(1)
	go func() {
		defer ss.statusWrites.Done()
		defer ss.stMu.Unlock()
		if in, _, err := ss.write(ctx, func(in *records.Instance) error { fn(in); return nil }, planned); err == nil {
			ss.in = in
		}
	}()
	ss.announce(ctx, probe, planned)
}

// write applies fn to the stored instance if the session still holds its
// claim, with the event of the status change it makes, if any, in the
// outbox (planned: that event, announced already). A lost claim, or a
// deleted instance, kills the session quietly. Call with stMu held.
func (ss *session) write(ctx context.Context, fn func(in *records.Instance) error, planned *records.OutboxEvent) (*records.Instance, *records.OutboxEvent, error) {
	var ev *records.OutboxEvent
	in, err := ss.s.o.Records.UpdateInstance(ctx, ss.launch.ID, ss.s.withStatusEvent(ctx, func(in *records.Instance) error {
		if in.ClaimMsg != ss.claimMsg || in.ClaimRecv != ss.claimRecv || in.ClaimSeq != ss.seq {
			return errClaimLost
		}
		return fn(in)
	}, planned, &ev))
	switch {
	case errors.Is(err, errClaimLost):
		ss.kill(stopSuperseded, "superseded: "+errClaimLost.Error())
	case errors.Is(err, records.ErrNotFound):
		ss.kill(stopDeleted, "deleted")
	case err != nil && !errors.Is(err, ErrBusy) && !errors.Is(err, ErrFinished):
		ss.s.log.WarnContext(ctx, "runner: recording an instance's status", "instance_id", ss.launch.ID, "error", err)
	}
	return in, ev, err
}

// announce logs and publishes a change of status to in's, whose event is
// ev (nil: the status did not change).
func (ss *session) announce(ctx context.Context, in *records.Instance, ev *records.OutboxEvent) {
	if ev == nil {
		return
	}
	ss.log.Add(StreamRunner, "status: "+in.Status+errorSuffix(in.Error))
	ss.s.announce(ctx, ev, in.Status)
}

func errorSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (" + e + ")"
}

// fail ends the launch as failed.
func (ss *session) fail(ctx context.Context, outcome, reason string) error {
	ss.s.o.Metrics.Launch(outcome)
	ss.setStatus(ctx, func(in *records.Instance) {
		in.Status, in.Error, in.FinishedAt, in.DoneSeq = records.StatusFailed, reason, time.Now().UTC(), ss.seq
		in.TurnDone, in.Prompt = in.Turn, ""
	})
	return nil
}

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
	o := ss.s.o
	claimed := false
	awaitClaim := func() error {
		if claimed {
			return nil
		}
		r := <-claim
		if r.err != nil {
			ss.log.Discard()
			return r.err
		}
		claimed = true
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

	if !in.PendingTurn() && in.TurnDone > 0 {
		if err := awaitClaim(); err != nil {
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
		if err := awaitClaim(); err != nil {
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
		if err := awaitClaim(); err != nil {
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
	spanCtx, startSpan := ss.s.tracer.Start(ctx, "start agent", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("conclave.executor", o.Executor.Name()),
			attribute.String("conclave.instance_id", ss.launch.ID), attribute.Int64("conclave.launch", int64(ss.seq))))
	startSpanOpen := true
	endStartSpan := func(proc executor.Process, err error) {
		if !startSpanOpen {
			return
		}
		startSpanOpen = false
		if err != nil {
			startSpan.RecordError(err)
			startSpan.SetStatus(codes.Error, err.Error())
		} else if proc != nil {
			startSpan.SetAttributes(attribute.String("conclave.container_id", proc.ID()))
		}
		startSpan.End()
	}
	defer endStartSpan(nil, nil)
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
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		select {
		case <-ss.s.stopping:
			ss.kill(stopShutdown, "runner shutting down")
		case <-stopWatch:
		}
	}()
	if kind, why := ss.killedWhy(); kind != stopNone {
		// Cancelled or deleted as it was claimed.
		if err := awaitClaim(); err != nil {
			return err
		}
		return ss.end(ctx, nil, "", "", nil, kind, why)
	}
	if typ.Protocol == agenttype.ProtocolOneshot {
		if err := awaitClaim(); err != nil {
			return err
		}
		return ss.runOneshot(ctx, typ, env)
	}
	spec := executor.Spec{InstanceID: ss.launch.ID, TaskID: ss.launch.TaskID, Type: typ, Workspace: ss.launch.Workspace, Env: env, Launch: int64(ss.seq)}
	var link HostLink
	if o.Hosts != nil {
		link = o.Hosts.Expect(ss.launch.ID, int64(ss.seq), ss.onUpdate, ss.log.Add)
		// Let go unless runHosted takes it over (a lost claim, a failed
		// start): another runner may be the one it belongs to.
		defer func() {
			ss.mu.Lock()
			adopted := ss.link != nil
			ss.mu.Unlock()
			if !adopted {
				link.Detach()
			}
		}()
		spec.Host = o.Hosts.Spec(ss.launch.ID, int64(ss.seq), typ, ss.launch.SessionID)
	}
	proc, err := o.Executor.Start(startCtx, spec, stderr)
	endStartSpan(proc, err)
	if cerr := awaitClaim(); cerr != nil {
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

// drive runs the protocol: the handshake, then the conversation. It returns
// an outcome and, for a failure, why.
func (ss *session) drive(ctx context.Context, client *acp.Client) (outcome, reason string) {
	o := ss.s.o
	hs, cancel := context.WithTimeout(ctx, o.ProtocolTimeout)
	defer cancel()
	if err := client.Initialize(hs); err != nil {
		return "dead_protocol", protocolFailure("initialize", err, o.ProtocolTimeout)
	}
	sessionID := ss.launch.SessionID
	if sessionID != "" && client.Capabilities().LoadSession {
		if err := client.LoadSession(hs, ss.launch.Workspace, sessionID); err != nil {
			return "dead_protocol", protocolFailure("session/load", err, o.ProtocolTimeout)
		}
	} else if client.Dialect() != acp.DialectLegacy {
		var err error
		if sessionID, err = client.NewSession(hs, ss.launch.Workspace); err != nil {
			return "dead_protocol", protocolFailure("session/new", err, o.ProtocolTimeout)
		}
	}
	cancel()
	ss.mu.Lock()
	containerID := ss.proc.ID()
	ss.mu.Unlock()
	sessionUp := func(in *records.Instance) {
		in.Status, in.SessionID, in.Dialect, in.ContainerID = records.StatusRunning, sessionID, client.Dialect(), containerID
	}
	if sessionID != "" {
		defer ss.recordSession(ctx, sessionID)()
	}
	return ss.converse(ctx, client, sessionUp, client.Dialect() == acp.DialectLegacy)
}

// recordSession records the session on the task, for resuming later. It
// writes beside the first turn rather than before it, as the turn should
// not wait on the write; the func it returns waits for the write.
func (ss *session) recordSession(ctx context.Context, sessionID string) (wait func()) {
	taskWritten := make(chan struct{})
	go func() {
		defer close(taskWritten)
		if _, err := ss.s.o.Records.UpdateTask(ctx, ss.launch.TaskID, func(t *records.Task) {
			if t.Metadata == nil {
				t.Metadata = map[string]any{}
			}
			t.Metadata["session_id"] = sessionID
			// Seed 002's name for it: a launch with env AUGGIE_SESSION_ID
			// set to it resumes the session.
			t.Metadata["auggie_session_id"] = sessionID
			t.Metadata["instance_id"] = ss.launch.ID
		}); err != nil {
			ss.s.log.WarnContext(ctx, "runner: recording the session on the task", "task_id", ss.launch.TaskID, "error", err)
		}
	}()
	return func() { <-taskWritten }
}

// converse runs the launch's pending turn (a legacy agent's run is always
// one), then further prompts until the agent goes idle for too long or
// goes away. sessionUp adds the session's fields to the first status
// write.
func (ss *session) converse(ctx context.Context, client conversation, sessionUp func(in *records.Instance), legacy bool) (outcome, reason string) {
	o := ss.s.o
	launch := ss.launch
	pending := launch.PendingTurn() || legacy
	// Cancelled while its runner was gone.
	cancelledWhileGone := pending && launch.CancelTurn == launch.Turn && launch.Turn > 0
	if cancelledWhileGone {
		pending = false
	}
	// The session takes prompts before its status says so: a caller that
	// prompts as soon as it reads running (or stopped) must not be told
	// the agent is still starting.
	ss.mu.Lock()
	ss.client = client
	if pending {
		ss.turning = true
		ss.turns++
		ss.turnID = client.BeginTurn()
	}
	ss.mu.Unlock()
	if cancelledWhileGone {
		ss.setStatus(ctx, func(in *records.Instance) {
			sessionUp(in)
			in.Status, in.TurnDone, in.Prompt, in.CancelTurn = records.StatusStopped, in.Turn, "", 0
			if in.FinishedAt.IsZero() {
				in.FinishedAt = time.Now().UTC()
			}
		})
	} else if !pending {
		ss.setStatus(ctx, sessionUp)
	}
	o.Metrics.Launch("started")
	if pending {
		// The session's fields go in the turn's start write.
		if out, why := ss.turn(ctx, client, pendingPrompt{turn: launch.Turn, message: launch.Prompt}, sessionUp); out != "" {
			return out, why
		}
	}
	idle := time.NewTimer(o.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case p := <-ss.prompts:
			if out, why := ss.turn(ctx, client, p, nil); out != "" {
				return out, why
			}
			idle.Reset(o.IdleTimeout)
		case <-client.Done():
			return "", ""
		case <-idle.C:
			// Under the lock prompt() reserves a turn with, so that a
			// prompt is either taken here or refused there.
			ss.mu.Lock()
			if ss.turning {
				ss.mu.Unlock()
				idle.Reset(o.IdleTimeout)
				continue
			}
			ss.ending = true
			ss.mu.Unlock()
			ss.log.Add(StreamRunner, fmt.Sprintf("idle for %s; stopping the agent (a prompt resumes the session)", o.IdleTimeout))
			return "", ""
		}
	}
}

func protocolFailure(method string, err error, timeout time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Sprintf("dead protocol: no answer to %s within %s", method, timeout)
	}
	return fmt.Sprintf("%s failed: %v", method, err)
}

// turn runs one prompt turn and records how it ended. A non-empty outcome
// ends the launch: the agent is gone. start, if not nil, is written beside
// the turn's start (the launch's first turn); a later prompt's start was
// written when it was accepted.
func (ss *session) turn(ctx context.Context, client conversation, p pendingPrompt, start func(in *records.Instance)) (outcome, reason string) {
	if start != nil {
		// The client waits on the agent's first update, not on this write:
		// the prompt goes out while it commits.
		ss.setStatusBeside(ctx, func(in *records.Instance) {
			start(in)
			in.Status, in.Progress, in.FinishedAt, in.Error = records.StatusRunning, 0, time.Time{}, ""
		})
	}
	var (
		t   acp.Turn
		err error
	)
	stopWatch := ss.watchSilence(client)
	if d, ok := client.(durableTurns); ok {
		t, err = d.PromptTurn(ctx, int64(p.turn), p.message, ss.s.o.ProtocolTimeout)
	} else {
		t, err = client.Prompt(ctx, p.message, ss.s.o.ProtocolTimeout)
	}
	stopWatch()
	ss.mu.Lock()
	ss.turning = false
	ss.mu.Unlock()
	kind, why := ss.killedWhy()
	if kind.quiet() {
		// The turn stays pending: whoever runs the launch next runs it.
		return "stopping", why
	}
	status, errText := records.StatusCompleted, ""
	switch t.StopReason {
	case acp.StopEndTurn:
	case acp.StopCancelled:
		status = records.StatusStopped
	case acp.StopError:
		status, errText = records.StatusFailed, t.Message
		if errors.Is(err, context.DeadlineExceeded) {
			errText = protocolFailure("session/prompt", err, ss.s.o.ProtocolTimeout)
		}
	default:
		// max_tokens, max_turn_requests, refusal: the turn ended, short.
		errText = "stop reason: " + t.StopReason
	}
	switch kind {
	case stopCancel:
		status, errText = records.StatusStopped, why
	case stopFailure, stopDead:
		status, errText = records.StatusFailed, why
	}
	ss.setStatus(ctx, func(in *records.Instance) {
		in.Status, in.Error, in.FinishedAt = status, errText, time.Now().UTC()
		if status == records.StatusCompleted {
			in.Progress = 100
		}
		if in.Turn == p.turn {
			in.Prompt = ""
		}
		in.TurnDone = max(in.TurnDone, p.turn)
		if in.CancelTurn <= p.turn {
			in.CancelTurn = 0
		}
	})
	if kind == stopDead {
		return "dead_protocol", errText
	}
	if err != nil && (errors.Is(err, acp.ErrAgentGone) || errors.Is(err, context.DeadlineExceeded)) {
		if errors.Is(err, context.DeadlineExceeded) {
			return "dead_protocol", errText
		}
		if status == records.StatusStopped {
			return "cancelled", errText
		}
		return "crashed", errText
	}
	return "", ""
}

// onUpdate records an update: a log line, progress, and an event. It runs on
// the client's read loop, in order.
func (ss *session) onUpdate(ctx context.Context, u acp.Update) {
	if u.Replay {
		// The session's history, which was published when it happened.
		ss.s.o.Metrics.Drop(acp.DropReplay)
		return
	}
	ss.s.o.Metrics.Update(u.Kind)
	text := u.Kind
	if u.ToolName != "" || u.ToolCallID != "" {
		text += " " + firstNonEmpty(u.ToolName, u.ToolCallID)
	}
	if u.ToolStatus != "" {
		text += " [" + u.ToolStatus + "]"
	}
	if u.Text != "" {
		text += ": " + u.Text
	}
	ss.log.Add(StreamACP, text)
	ss.stMu.Lock()
	progress := ss.in.Progress
	ss.stMu.Unlock()
	if u.Progress >= 0 && u.Progress != progress {
		ss.setStatus(ctx, func(in *records.Instance) { in.Progress = u.Progress })
	}
	payload := map[string]any{"instance_id": ss.launch.ID, "kind": u.Kind, "update": string(u.Raw)}
	if u.Text != "" {
		payload["text"] = u.Text
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// Notifications without a traceparent of their own belong to the
		// launch's trace.
		ctx = ss.traceCtx(ctx)
	}
	ss.s.events.Publish(ctx, EventSessionUpdate, ss.launch.TaskID, ss.launch.ID, payload)
}

// traceCtx is ctx with the launch's span context.
func (ss *session) traceCtx(ctx context.Context) context.Context {
	if ss.launchSpan.IsValid() {
		return trace.ContextWithSpanContext(ctx, ss.launchSpan)
	}
	return ctx
}

// Live reports whether this replica runs a process for the instance.
func (s *Supervisor) Live(id string) bool { return s.session(id) != nil }

// heardFrom is a conversation that knows when its agent last wrote
// anything (the ACP client over a local agent's stdout).
type heardFrom interface {
	LastHeard() time.Time
}

// watchSilence watches a turn of client for a dead protocol: an agent that
// has sent nothing at all (no update, request or response, not even part
// of a line) for the silence limit of its type is killed, and the turn
// fails. An agent that thinks for long keeps the turn alive with updates
// (ACP agent_thought_chunk, a kandev progress update, a legacy heartbeat)
// or needs a longer silence_timeout; the type's timeout bounds the launch
// either way. The returned func stops the watch.
func (ss *session) watchSilence(client conversation) (stop func()) {
	h, ok := client.(heardFrom)
	limit := ss.silence
	if !ok || limit <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		since := time.Now()
		check := time.NewTimer(limit)
		defer check.Stop()
		for {
			select {
			case <-done:
				return
			case <-check.C:
			}
			last := h.LastHeard()
			if last.Before(since) {
				last = since
			}
			if quiet := time.Since(last); quiet < limit {
				check.Reset(limit - quiet)
				continue
			}
			ss.log.Add(StreamRunner, fmt.Sprintf("the agent has sent nothing for %s in the middle of a turn; killing it (dead protocol)", limit))
			ss.kill(stopDead, fmt.Sprintf("dead protocol: no message from the agent for %s mid-turn", limit))
			return
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}
