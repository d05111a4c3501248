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
	"maps"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
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
	// CancelGrace is how long a turn may take to end after session/cancel
	// before the process is killed.
	CancelGrace time.Duration
	// IdleTimeout is how long an agent with no turn in progress is kept for
	// further prompts; a later prompt resumes the session in a new process.
	IdleTimeout time.Duration
	// MaxLine bounds a line from an agent.
	MaxLine int
	Source  string
	Logger  *slog.Logger
	// TracerProvider makes the workers' consumer spans.
	TracerProvider trace.TracerProvider
	Metrics        Metrics
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

	mu       sync.Mutex
	sessions map[string]*session
	// writing holds the instances whose first write is in progress beside
	// their launch's enqueue, each closed when the write has ended.
	writing  map[string]chan struct{}
	stopping chan struct{}
	stopOnce sync.Once
}

// New returns a supervisor; Run starts its workers.
func New(o Options) *Supervisor {
	s := &Supervisor{o: o, log: o.Logger, sessions: map[string]*session{}, writing: map[string]chan struct{}{}, stopping: make(chan struct{})}
	s.logs = newLogBook(o.Records, o.Logger)
	s.events = newEvents(o.Queue, o.EventsQueue, o.Source, o.Logger, o.Metrics.Events)
	return s
}

// launchMessage is a launch on the queue.
type launchMessage struct {
	InstanceID string `json:"instance_id"`
	Seq        int    `json:"seq"`
}

// Enqueue queues launch seq of an instance already written.
func (s *Supervisor) Enqueue(ctx context.Context, instanceID string, seq int) error {
	body, _ := json.Marshal(launchMessage{InstanceID: instanceID, Seq: seq})
	if _, err := s.o.Queue.Send(ctx, s.o.LaunchQueue, queue.Outgoing{Body: body}); err != nil {
		return fmt.Errorf("queueing the launch: %w", err)
	}
	return nil
}

// instanceWriteGrace is how long after it was sent a launch whose instance
// is not in the store is tried again rather than dropped: the instance's
// write may still be in progress on another replica (Launch writes and
// queues at once).
const instanceWriteGrace = time.Minute

// errNotWrittenYet leaves a launch on the queue until its instance is written.
var errNotWrittenYet = errors.New("the instance is not written yet; the launch will be retried")

// Launch writes a new instance with write and queues its first launch, the
// two at once, so that the launch request waits for one commit's time
// rather than two (on the embedded store and queue the two files' fsyncs
// overlap; on DynamoDB and SQS the round trips do). The caller answers only
// once both have succeeded, so an acknowledged launch is both stored and
// queued. A worker of this replica that receives the launch before the
// write ends waits for it; see handle for other replicas. If the queueing
// fails the instance is marked failed, since nothing will start it.
func (s *Supervisor) Launch(ctx context.Context, instanceID string, write func(context.Context) error) error {
	written := make(chan struct{})
	s.mu.Lock()
	s.writing[instanceID] = written
	s.mu.Unlock()
	queued := make(chan error, 1)
	go func() { queued <- s.Enqueue(ctx, instanceID, 1) }()
	writeErr := write(ctx)
	close(written)
	s.mu.Lock()
	delete(s.writing, instanceID)
	s.mu.Unlock()
	queueErr := <-queued
	if writeErr != nil {
		// A launch that was queued finds no instance and is dropped: at
		// once on this replica, after instanceWriteGrace on another.
		return writeErr
	}
	if queueErr != nil {
		_, _ = s.o.Records.UpdateInstance(context.WithoutCancel(ctx), instanceID, func(i *records.Instance) error {
			i.Status, i.Error, i.DoneSeq = records.StatusFailed, queueErr.Error(), 1
			return nil
		})
		return queueErr
	}
	return nil
}

// awaitWrite waits for Launch's write of the instance, if one is in
// progress here, and reports whether there was one.
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

// Run consumes launches until ctx ends, then stops the agents it runs:
// their launches go back on the queue for the next runner.
func (s *Supervisor) Run(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.stopOnce.Do(func() { close(s.stopping) })
	}()
	err := queue.Consume(ctx, s.o.Queue, s.o.LaunchQueue, s.handle, queue.ConsumerOptions{
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

func (s *Supervisor) handle(ctx context.Context, m queue.Message) error {
	var msg launchMessage
	if err := json.Unmarshal(m.Body, &msg); err != nil || msg.InstanceID == "" {
		s.log.WarnContext(ctx, "runner: dropping an unreadable launch", "message_id", m.ID, "error", err)
		s.o.Metrics.Launch("unreadable")
		return nil
	}
	waited := s.awaitWrite(ctx, msg.InstanceID)
	in, err := s.o.Records.Instance(ctx, msg.InstanceID)
	if errors.Is(err, records.ErrNotFound) {
		if !waited && time.Since(m.SentAt) < instanceWriteGrace {
			return fmt.Errorf("launch of instance %s: %w", msg.InstanceID, errNotWrittenYet)
		}
		s.o.Metrics.Launch("gone")
		return nil
	}
	if err != nil {
		return err
	}
	if in.Deleted || msg.Seq <= in.DoneSeq || msg.Seq < in.LaunchSeq {
		// Done already (a redelivery), superseded, or cancelled while queued.
		s.o.Metrics.Launch("duplicate")
		return nil
	}
	if live := s.session(in.ID); live != nil {
		<-live.done
		return nil
	}
	if m.ReceiveCount > 1 {
		s.log.InfoContext(ctx, "runner: retrying a launch whose runner stopped", "instance_id", in.ID, "attempt", m.ReceiveCount)
	}
	sess := newSession(s, in, msg.Seq)
	s.mu.Lock()
	s.sessions[in.ID] = sess
	s.mu.Unlock()
	s.o.Metrics.Running(1)
	defer func() {
		s.o.Metrics.Running(-1)
		s.mu.Lock()
		delete(s.sessions, in.ID)
		s.mu.Unlock()
		// A prompt accepted as the agent exited: resume the session for it.
		select {
		case message := <-sess.prompts:
			if err := s.Prompt(context.WithoutCancel(ctx), in.ID, message); err != nil {
				s.log.WarnContext(ctx, "runner: resuming for a prompt that arrived as the agent exited", "instance_id", in.ID, "error", err)
			}
		default:
		}
	}()
	return sess.run(ctx)
}

// Prompt sends a prompt to an instance: to its live agent if it is idle, or
// by resuming the session in a new process if the agent is gone.
func (s *Supervisor) Prompt(ctx context.Context, id, message string) error {
	if live := s.session(id); live != nil {
		return live.prompt(message)
	}
	in, err := s.o.Records.UpdateInstance(ctx, id, func(in *records.Instance) error {
		switch {
		case in.Deleted:
			return fmt.Errorf("instance %s is being deleted: %w", id, ErrFinished)
		case in.LaunchSeq > in.DoneSeq:
			return fmt.Errorf("instance %s is %s; wait for its turn to end: %w", id, in.Status, ErrBusy)
		}
		in.LaunchSeq++
		in.Prompt = message
		in.Status, in.Progress, in.FinishedAt, in.Error = records.StatusStarting, 0, time.Time{}, ""
		return nil
	})
	if err != nil {
		return err
	}
	s.o.Metrics.Status(in.Status)
	s.events.Publish(ctx, EventStatusChanged, in.TaskID, in.ID, statusPayload(in))
	return s.Enqueue(ctx, id, in.LaunchSeq)
}

// Cancel ends an instance's turn: session/cancel to a live agent (killed
// if it has not stopped after the grace period), or dropping a launch still
// queued.
func (s *Supervisor) Cancel(ctx context.Context, id, reason string) (*records.Instance, error) {
	if live := s.session(id); live != nil {
		live.cancel(reason)
		return s.o.Records.Instance(ctx, id)
	}
	in, err := s.o.Records.UpdateInstance(ctx, id, func(in *records.Instance) error {
		if in.LaunchSeq > in.DoneSeq {
			in.DoneSeq = in.LaunchSeq
			in.Status, in.FinishedAt, in.Error = records.StatusStopped, time.Now().UTC(), "cancelled before it started: "+reason
		}
		return nil
	})
	if err == nil && in.Status == records.StatusStopped {
		s.o.Metrics.Status(in.Status)
		s.events.Publish(ctx, EventStatusChanged, in.TaskID, in.ID, statusPayload(in))
	}
	return in, err
}

// Delete kills an instance's agent and removes its records.
func (s *Supervisor) Delete(ctx context.Context, id string) error {
	if _, err := s.o.Records.UpdateInstance(ctx, id, func(in *records.Instance) error {
		in.Deleted = true
		return nil
	}); err != nil {
		return err
	}
	if live := s.session(id); live != nil {
		live.kill("deleted")
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

// session is one launch of an instance: its process, client and turns.
type session struct {
	s   *Supervisor
	seq int
	log *instanceLog
	// launch is the instance as the launch found it: its configuration.
	launch records.Instance

	// stMu guards in, the instance as last written.
	stMu sync.Mutex
	in   *records.Instance
	// statusWrites are setStatusBeside's writes in progress.
	statusWrites sync.WaitGroup

	mu      sync.Mutex
	client  *acp.Client
	proc    executor.Process
	turning bool
	killed  string // why the process was killed, once it was
	prompts chan string
	done    chan struct{}
	// cancelKilled: the process was killed because it ignored a cancel, so
	// its turn ends stopped, as asked, rather than failed.
	cancelKilled bool
	// turns numbers turns, so that a cancel's grace applies to its own.
	turns int
	// ending: the session takes no more prompts; its process is stopping.
	ending bool
	// launchSpan is the worker's span, which updates join.
	launchSpan trace.SpanContext
}

func newSession(s *Supervisor, in *records.Instance, seq int) *session {
	return &session{s: s, in: in, launch: *in, seq: seq, prompts: make(chan string, 1), done: make(chan struct{})}
}

func (ss *session) prompt(message string) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.client == nil || ss.turning {
		return fmt.Errorf("instance %s has a turn in progress or is starting: %w", ss.launch.ID, ErrBusy)
	}
	if ss.killed != "" || ss.ending {
		return fmt.Errorf("instance %s is stopping; retry to resume it: %w", ss.launch.ID, ErrBusy)
	}
	select {
	case ss.prompts <- message:
		ss.turning = true
		ss.turns++
		return nil
	default:
		return fmt.Errorf("instance %s has a prompt waiting: %w", ss.launch.ID, ErrBusy)
	}
}

func (ss *session) cancel(reason string) {
	ss.mu.Lock()
	client, turning, turnNo := ss.client, ss.turning, ss.turns
	ss.mu.Unlock()
	if client == nil {
		ss.kill("cancelled while starting: " + reason)
		return
	}
	if !turning {
		return
	}
	ss.log.Add(StreamRunner, "cancel requested: "+reason)
	if err := client.Cancel(context.Background(), reason); err != nil {
		ss.kill("cancel could not be sent: " + err.Error())
		return
	}
	grace := time.AfterFunc(ss.s.o.CancelGrace, func() {
		ss.mu.Lock()
		still := ss.turning && ss.turns == turnNo
		ss.mu.Unlock()
		if still {
			ss.mu.Lock()
			ss.cancelKilled = true
			ss.mu.Unlock()
			ss.kill(fmt.Sprintf("the agent ignored session/cancel for %s", ss.s.o.CancelGrace))
		}
	})
	go func() {
		<-ss.done
		grace.Stop()
	}()
}

// kill ends the process group, once; reason becomes the instance's error.
func (ss *session) kill(reason string) {
	ss.mu.Lock()
	proc := ss.proc
	if ss.killed == "" {
		ss.killed = reason
	}
	ss.mu.Unlock()
	if proc != nil {
		_ = proc.Kill()
	}
}

func (ss *session) killedWhy() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.killed
}

// setStatus records a status change and sends its event, once the change
// is written.
func (ss *session) setStatus(ctx context.Context, fn func(in *records.Instance)) {
	ss.stMu.Lock()
	defer ss.stMu.Unlock()
	// A change that changes nothing costs no write: each is a durable commit.
	if ss.in != nil {
		probe := *ss.in
		fn(&probe)
		if reflect.DeepEqual(&probe, ss.in) {
			return
		}
	}
	if in := ss.writeStatus(ctx, fn); in != nil {
		ss.announce(ctx, ss.in.Status, in)
		ss.in = in
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
	probe := *ss.in
	fn(&probe)
	if reflect.DeepEqual(&probe, ss.in) {
		ss.stMu.Unlock()
		return
	}
	ss.announce(ctx, ss.in.Status, &probe)
	ss.statusWrites.Add(1)
	go func() {
		defer ss.statusWrites.Done()
		defer ss.stMu.Unlock()
		if in := ss.writeStatus(ctx, fn); in != nil {
			ss.in = in
		}
	}()
}

// writeStatus applies fn to the stored instance; nil if that failed (it is
// logged). Call with stMu held.
func (ss *session) writeStatus(ctx context.Context, fn func(in *records.Instance)) *records.Instance {
	in, err := ss.s.o.Records.UpdateInstance(ctx, ss.launch.ID, func(in *records.Instance) error {
		fn(in)
		return nil
	})
	if err != nil {
		ss.s.log.WarnContext(ctx, "runner: recording an instance's status", "instance_id", ss.launch.ID, "error", err)
		return nil
	}
	return in
}

// announce logs and publishes a change of status from prev to in's.
func (ss *session) announce(ctx context.Context, prev string, in *records.Instance) {
	if in.Status != prev {
		ss.s.o.Metrics.Status(in.Status)
		ss.log.Add(StreamRunner, "status: "+in.Status+errorSuffix(in.Error))
		ss.s.events.Publish(ctx, EventStatusChanged, in.TaskID, in.ID, statusPayload(in))
	}
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
	})
	return nil
}

func (ss *session) run(ctx context.Context) error {
	defer close(ss.done)
	defer ss.statusWrites.Wait()
	ss.launchSpan = trace.SpanContextFromContext(ctx)
	ss.log = ss.s.logs.open(ctx, ss.launch.ID)
	defer ss.log.Close()
	o := ss.s.o

	typ, ok := o.Registry.Get(ss.launch.AgentType)
	if !ok || !typ.Enabled {
		return ss.fail(ctx, "bad_type", fmt.Sprintf("agent type %q is not registered or not enabled", ss.launch.AgentType))
	}
	env := maps.Clone(typ.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, ss.launch.Env)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if tp := carrier["traceparent"]; tp != "" {
		env["TRACEPARENT"] = tp
	}
	stderr := &lineWriter{log: ss.log, stream: StreamStderr}
	proc, err := o.Executor.Start(ctx, executor.Spec{InstanceID: ss.launch.ID, TaskID: ss.launch.TaskID, Type: typ, Workspace: ss.launch.Workspace, Env: env}, stderr)
	if err != nil {
		return ss.fail(ctx, "start_failed", err.Error())
	}
	ss.mu.Lock()
	ss.proc = proc
	ss.mu.Unlock()
	ss.log.Add(StreamRunner, fmt.Sprintf("started %s as %s %s (launch %d)", typ.ID, o.Executor.Name(), proc.ID(), ss.seq))
	exited := make(chan error, 1)
	go func() {
		err := proc.Wait()
		stderr.Flush()
		exited <- err
	}()
	// The timeout covers the whole launch, and kills the whole group.
	timeout := time.AfterFunc(typ.EffectiveTimeout(), func() {
		ss.kill(fmt.Sprintf("timed out after %s", typ.EffectiveTimeout()))
	})
	defer timeout.Stop()
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		select {
		case <-ss.s.stopping:
			ss.kill("runner shutting down")
		case <-stopWatch:
		}
	}()

	client := acp.New(proc.Stdout(), proc.Stdin(), acp.Options{
		Dialect: typ.Protocol, Workspace: ss.launch.Workspace, Permission: typ.Permission, MaxLine: o.MaxLine,
		OnUpdate: ss.onUpdate, OnDrop: o.Metrics.Drop, Logger: ss.s.log.With("instance_id", ss.launch.ID),
	})
	defer client.Close()

	outcome, reason := ss.drive(ctx, client, typ)
	ss.mu.Lock()
	ss.ending = true
	ss.mu.Unlock()
	// Close stdin: a well-behaved agent exits; one that does not is killed.
	_ = client.Close()
	var exitErr error
	select {
	case exitErr = <-exited:
	case <-time.After(o.CancelGrace):
		ss.kill("did not exit after its stdin closed")
		exitErr = <-exited
	}
	if why := ss.killedWhy(); why != "" {
		if why == "runner shutting down" {
			// Not recorded as done: the launch goes back on the queue.
			ss.log.Add(StreamRunner, "stopped: runner shutting down; the launch will be retried")
			return errStopping
		}
		if why == "deleted" {
			return nil
		}
		if outcome == "" || outcome == "completed" {
			outcome, reason = "killed", why
		}
	}
	if outcome == "" && exitErr != nil {
		outcome, reason = "exited", fmt.Sprintf("the agent exited: %v", exitErr)
	}
	o.Metrics.Launch(firstNonEmpty(outcome, "completed"))
	ss.setStatus(context.WithoutCancel(ctx), func(in *records.Instance) {
		in.DoneSeq = ss.seq
		if in.ContainerID == "" {
			// A launch that ended before its session was up.
			in.ContainerID = proc.ID()
		}
		if reason != "" && in.Status != records.StatusFailed && in.Status != records.StatusStopped {
			in.Status, in.Error = records.StatusFailed, reason
			if outcome == "cancelled" {
				in.Status = records.StatusStopped
			}
		}
		if in.Status == records.StatusRunning || in.Status == records.StatusStarting {
			in.Status = records.StatusCompleted
		}
		if in.FinishedAt.IsZero() {
			in.FinishedAt = time.Now().UTC()
		}
	})
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

// drive runs the protocol: handshake, the launch's prompt, then further
// prompts until the agent goes idle for too long or exits. It returns an
// outcome and, for a failure, why.
func (ss *session) drive(ctx context.Context, client *acp.Client, typ agenttype.Type) (outcome, reason string) {
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
	ss.client = client
	ss.mu.Unlock()
	ss.mu.Lock()
	containerID := ss.proc.ID()
	ss.mu.Unlock()
	sessionUp := func(in *records.Instance) {
		in.Status, in.SessionID, in.Dialect, in.ContainerID = records.StatusRunning, sessionID, client.Dialect(), containerID
	}
	message := ss.launch.Prompt
	if message == "" && ss.seq == 1 {
		message = ss.launch.Env["TASK_DESCRIPTION"]
	}
	firstTurn := message != "" || client.Dialect() == acp.DialectLegacy
	if !firstTurn {
		ss.setStatus(ctx, sessionUp)
	}
	if sessionID != "" {
		// Beside the first turn rather than before it: the session id is for
		// resuming later, and the turn should not wait on the write.
		taskWritten := make(chan struct{})
		defer func() { <-taskWritten }()
		go func() {
			defer close(taskWritten)
			if _, err := o.Records.UpdateTask(ctx, ss.launch.TaskID, func(t *records.Task) {
				if t.Metadata == nil {
					t.Metadata = map[string]any{}
				}
				t.Metadata["session_id"] = sessionID
				t.Metadata["instance_id"] = ss.launch.ID
			}); err != nil {
				ss.s.log.WarnContext(ctx, "runner: recording the session on the task", "task_id", ss.launch.TaskID, "error", err)
			}
		}()
	}
	o.Metrics.Launch("started")

	if firstTurn {
		ss.mu.Lock()
		ss.turning = true
		ss.turns++
		ss.mu.Unlock()
		// The session's fields go in the turn's start write.
		if out, why := ss.turn(ctx, client, message, sessionUp); out != "" {
			return out, why
		}
	}
	idle := time.NewTimer(o.IdleTimeout)
	defer idle.Stop()
	for {
		select {
		case message := <-ss.prompts:
			if out, why := ss.turn(ctx, client, message, nil); out != "" {
				return out, why
			}
			idle.Reset(o.IdleTimeout)
		case <-client.Done():
			return "", ""
		case <-idle.C:
			// Under the lock prompt() sends with, so that a prompt is either
			// taken here or refused there.
			ss.mu.Lock()
			select {
			case message := <-ss.prompts:
				ss.mu.Unlock()
				if out, why := ss.turn(ctx, client, message, nil); out != "" {
					return out, why
				}
				idle.Reset(o.IdleTimeout)
				continue
			default:
				ss.ending = true
				ss.mu.Unlock()
			}
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
// ends the launch: the agent is gone. also, if not nil, adds to the turn's
// start write.
func (ss *session) turn(ctx context.Context, client *acp.Client, message string, also func(in *records.Instance)) (outcome, reason string) {
	// The client waits on the agent's first update, not on this write: the
	// prompt goes out while it commits.
	ss.setStatusBeside(ctx, func(in *records.Instance) {
		if also != nil {
			also(in)
		}
		in.Status, in.Progress, in.FinishedAt, in.Error, in.Prompt = records.StatusRunning, 0, time.Time{}, "", ""
	})
	t, err := client.Prompt(ctx, message, ss.s.o.ProtocolTimeout)
	ss.mu.Lock()
	ss.turning = false
	ss.mu.Unlock()
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
	if why := ss.killedWhy(); why != "" {
		status, errText = records.StatusFailed, why
		ss.mu.Lock()
		if t.StopReason == acp.StopCancelled || ss.cancelKilled {
			status = records.StatusStopped
		}
		ss.mu.Unlock()
	}
	ss.setStatus(ctx, func(in *records.Instance) {
		in.Status, in.Error, in.FinishedAt = status, errText, time.Now().UTC()
		if status == records.StatusCompleted {
			in.Progress = 100
		}
	})
	if err != nil && (errors.Is(err, acp.ErrAgentGone) || errors.Is(err, context.DeadlineExceeded)) {
		if errors.Is(err, context.DeadlineExceeded) {
			return "dead_protocol", errText
		}
		if status == records.StatusStopped {
			return "cancelled", ""
		}
		return "crashed", errText
	}
	return "", ""
}

// onUpdate records an update: a log line, progress, and an event. It runs on
// the client's read loop, in order.
func (ss *session) onUpdate(ctx context.Context, u acp.Update) {
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
