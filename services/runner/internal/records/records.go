// Package records keeps the runner's state in pkg/store: instances, tasks
// and instance logs, in one table.
package records

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
)

// Table holds every record of the runner.
var Table = store.Table{Name: "runner"}

// Statuses of an instance (seed 002).
const (
	StatusStarting  = "starting"
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusStopped   = "stopped"
)

// Instance is one launched agent.
type Instance struct {
	ID          string         `json:"id"`
	TaskID      string         `json:"task_id"`
	AgentType   string         `json:"agent_type"`
	ContainerID string         `json:"container_id,omitempty"`
	Status      string         `json:"status"`
	Progress    int            `json:"progress"`
	StartedAt   time.Time      `json:"started_at"`
	FinishedAt  time.Time      `json:"finished_at,omitzero"`
	Workspace   string         `json:"workspace"`
	Priority    int            `json:"priority,omitempty"`
	Metadata    map[string]any `json:"metadata,omitempty"`
	// Env is the launch's env, kept so that a retried launch gets it too.
	// The store is the one place it is written; it is never logged.
	Env       map[string]string `json:"env,omitempty"`
	SessionID string            `json:"session_id,omitempty"`
	Dialect   string            `json:"dialect,omitempty"`
	// Error says why the instance failed.
	Error string `json:"error,omitempty"`
	// LaunchSeq numbers launches of this instance (the first and each
	// resumption); DoneSeq is the last one whose process has ended, so a
	// redelivered launch message at or below it is already done.
	LaunchSeq int `json:"launch_seq"`
	DoneSeq   int `json:"done_seq"`
	// Turn numbers the prompts the instance has accepted; TurnDone is the
	// last whose turn has ended. While Turn > TurnDone, Prompt is turn
	// Turn's message: stored before the prompt is acknowledged, so that a
	// launch delivered again after its runner died runs it (and does not
	// run a finished turn again).
	Turn     int    `json:"turn,omitempty"`
	TurnDone int    `json:"turn_done,omitempty"`
	Prompt   string `json:"prompt,omitempty"`
	// CancelTurn is a turn cancelled while no runner held it (its runner
	// was gone or it was still queued): a launch delivered again ends it
	// stopped rather than running it.
	CancelTurn int `json:"cancel_turn,omitempty"`
	// The claim: which delivery of a launch message runs launch ClaimSeq,
	// and on which replica (Owner, the address other replicas forward the
	// instance's requests to). A second message for the same launch is a
	// duplicate; the same message delivered again (its runner died) takes
	// the launch over, and the runner it was taken from stops at its next
	// write.
	ClaimSeq  int    `json:"claim_seq,omitempty"`
	ClaimMsg  string `json:"claim_msg,omitempty"`
	ClaimRecv int    `json:"claim_recv,omitempty"`
	Owner     string `json:"owner,omitempty"`
	// Deleted marks an instance being deleted; its launch, if queued, is
	// dropped.
	Deleted bool `json:"deleted,omitempty"`
	// Outbox holds the status-change events written with the changes they
	// announce (the store has no transactions: the instance's own item is
	// the one write that is atomic with its status) and not yet known to
	// be on the events queue. They are removed once sent; a runner that
	// dies first leaves them for the next delivery of the instance's
	// launch, which sends them again under the same ids.
	Outbox  []OutboxEvent `json:"outbox,omitempty"`
	version int64
}

// OutboxEvent is an event waiting in an instance's outbox: enough to
// rebuild its envelope exactly, id and time included.
type OutboxEvent struct {
	ID          string         `json:"id"`
	Type        string         `json:"type"`
	Time        time.Time      `json:"time"`
	TaskID      string         `json:"task_id"`
	InstanceID  string         `json:"instance_id"`
	Payload     map[string]any `json:"payload"`
	Traceparent string         `json:"traceparent,omitempty"`
	Tracestate  string         `json:"tracestate,omitempty"`
}

// MaxOutbox bounds an instance's outbox: with the events queue down for
// long, the oldest events give way (a status change's event is small, so
// this keeps the item far below the store's limit).
const MaxOutbox = 64

// AddToOutbox appends ev to the outbox, dropping the oldest past MaxOutbox;
// it returns how many were dropped.
func (i *Instance) AddToOutbox(ev OutboxEvent) int {
	i.Outbox = append(i.Outbox, ev)
	if over := len(i.Outbox) - MaxOutbox; over > 0 {
		i.Outbox = append([]OutboxEvent(nil), i.Outbox[over:]...)
		return over
	}
	return 0
}

// PendingTurn reports whether a prompt was accepted whose turn has not
// ended.
func (i *Instance) PendingTurn() bool { return i.Turn > i.TurnDone }

// Launching reports whether a launch is queued or running.
func (i *Instance) Launching() bool { return i.LaunchSeq > i.DoneSeq }

// Terminal reports whether the instance has finished its work.
func (i *Instance) Terminal() bool {
	switch i.Status {
	case StatusCompleted, StatusFailed, StatusStopped:
		return true
	}
	return false
}

// Task is the unit of work instances are launched for.
type Task struct {
	ID          string         `json:"id"`
	Status      string         `json:"status"`
	AgentType   string         `json:"agent_type"`
	Metadata    map[string]any `json:"metadata,omitempty"`
	InstanceIDs []string       `json:"instance_ids,omitempty"`
	CreatedAt   time.Time      `json:"created_at"`
	UpdatedAt   time.Time      `json:"updated_at"`
	version     int64
}

// ErrNotFound is returned for a missing instance or task.
var ErrNotFound = errors.New("not found")

// Records is the runner's state.
type Records struct {
	st store.Store
}

// New keeps records in st, whose Table must exist.
func New(st store.Store) *Records { return &Records{st: st} }

func instanceKey(id string) store.Key { return store.Key{PK: "instance#" + id, SK: "instance"} }
func taskKey(id string) store.Key     { return store.Key{PK: "task#" + id, SK: "task"} }

// CreateInstance writes a new instance; it fails if the id exists.
func (r *Records) CreateInstance(ctx context.Context, in *Instance) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	it, err := r.st.Put(ctx, Table.Name, store.Item{Key: instanceKey(in.ID), Data: data}, store.IfNotExists())
	if err != nil {
		return fmt.Errorf("creating instance %s: %w", in.ID, err)
	}
	in.version = it.Version
	return nil
}

// Instance returns the instance id.
func (r *Records) Instance(ctx context.Context, id string) (*Instance, error) {
	it, err := r.st.Get(ctx, Table.Name, instanceKey(id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("instance %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var in Instance
	if err := json.Unmarshal(it.Data, &in); err != nil {
		return nil, fmt.Errorf("instance %s: %w", id, err)
	}
	in.version = it.Version
	return &in, nil
}

// UpdateInstance applies fn to the current instance and writes it back,
// retrying when another writer got there first.
func (r *Records) UpdateInstance(ctx context.Context, id string, fn func(*Instance) error) (*Instance, error) {
	for {
		in, err := r.Instance(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := fn(in); err != nil {
			return nil, err
		}
		data, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		it, err := r.st.Put(ctx, Table.Name, store.Item{Key: instanceKey(id), Data: data}, store.IfVersion(in.version))
		if errors.Is(err, store.ErrConditionFailed) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("updating instance %s: %w", id, err)
		}
		in.version = it.Version
		return in, nil
	}
}

// DeleteInstance removes the instance and its logs.
func (r *Records) DeleteInstance(ctx context.Context, id string) error {
	if err := r.st.Delete(ctx, Table.Name, instanceKey(id)); err != nil {
		return err
	}
	for {
		page, err := r.st.Query(ctx, Table.Name, store.Query{PK: logPK(id), Limit: 1000})
		if err != nil {
			return err
		}
		for _, it := range page.Items {
			if err := r.st.Delete(ctx, Table.Name, it.Key); err != nil {
				return err
			}
		}
		if page.Cursor == "" {
			return nil
		}
	}
}

// Task returns the task id.
func (r *Records) Task(ctx context.Context, id string) (*Task, error) {
	it, err := r.st.Get(ctx, Table.Name, taskKey(id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("task %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var t Task
	if err := json.Unmarshal(it.Data, &t); err != nil {
		return nil, fmt.Errorf("task %s: %w", id, err)
	}
	t.version = it.Version
	return &t, nil
}

// UpdateTask applies fn to the task, created empty if missing.
func (r *Records) UpdateTask(ctx context.Context, id string, fn func(*Task)) (*Task, error) {
	for {
		t, err := r.Task(ctx, id)
		cond := store.IfNotExists()
		switch {
		case errors.Is(err, ErrNotFound):
			now := time.Now().UTC()
			t = &Task{ID: id, CreatedAt: now}
		case err != nil:
			return nil, err
		default:
			cond = store.IfVersion(t.version)
		}
		fn(t)
		t.UpdatedAt = time.Now().UTC()
		data, err := json.Marshal(t)
		if err != nil {
			return nil, err
		}
		it, err := r.st.Put(ctx, Table.Name, store.Item{Key: taskKey(id), Data: data}, cond)
		if errors.Is(err, store.ErrConditionFailed) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("updating task %s: %w", id, err)
		}
		t.version = it.Version
		return t, nil
	}
}

// LogLine is one line of an instance's log.
type LogLine struct {
	Time   time.Time `json:"t"`
	Stream string    `json:"s"`
	Text   string    `json:"x"`
}

func logPK(id string) string { return "log#" + id }

// AppendLogs writes lines as one chunk numbered seq.
func (r *Records) AppendLogs(ctx context.Context, instanceID string, seq int64, lines []LogLine) error {
	data, err := json.Marshal(lines)
	if err != nil {
		return err
	}
	key := store.Key{PK: logPK(instanceID), SK: fmt.Sprintf("%016d", seq)}
	_, err = r.st.Put(ctx, Table.Name, store.Item{Key: key, Data: data, ExpiresAt: time.Now().Add(LogRetention)})
	return err
}

// LogRetention is how long log chunks are kept.
const LogRetention = 7 * 24 * time.Hour

// TailLogs returns the last n lines, oldest first, and the sequence number
// of the newest chunk (-1 when there is none).
func (r *Records) TailLogs(ctx context.Context, instanceID string, n int) ([]LogLine, int64, error) {
	var (
		chunks [][]LogLine
		count  int
		cursor string
		newest int64 = -1
	)
	for count < n {
		page, err := r.st.Query(ctx, Table.Name, store.Query{PK: logPK(instanceID), Reverse: true, Limit: 50, Cursor: cursor})
		if err != nil {
			return nil, -1, err
		}
		for _, it := range page.Items {
			if newest < 0 {
				newest, _ = strconv.ParseInt(it.SK, 10, 64)
			}
			var lines []LogLine
			if err := json.Unmarshal(it.Data, &lines); err != nil {
				continue
			}
			chunks = append(chunks, lines)
			count += len(lines)
			if count >= n {
				break
			}
		}
		if page.Cursor == "" {
			break
		}
		cursor = page.Cursor
	}
	out := make([]LogLine, 0, min(count, n))
	for i := len(chunks) - 1; i >= 0; i-- {
		out = append(out, chunks[i]...)
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out, newest, nil
}

// LogChunk is one stored chunk of an instance's log: the lines one write
// stored, numbered in the order they were written.
type LogChunk struct {
	Seq   int64
	Lines []LogLine
}

// LogsAfter returns up to limit of the instance's chunks numbered above
// after, oldest first: what a follower that has read up to chunk after
// has not seen. A chunk that cannot be decoded is returned empty, so that
// the follower moves past it.
func (r *Records) LogsAfter(ctx context.Context, instanceID string, after int64, limit int) ([]LogChunk, error) {
	page, err := r.st.Query(ctx, Table.Name, store.Query{PK: logPK(instanceID), From: fmt.Sprintf("%016d", after+1), Limit: limit})
	if err != nil {
		return nil, err
	}
	out := make([]LogChunk, 0, len(page.Items))
	for _, it := range page.Items {
		seq, err := strconv.ParseInt(it.SK, 10, 64)
		if err != nil {
			continue
		}
		c := LogChunk{Seq: seq}
		_ = json.Unmarshal(it.Data, &c.Lines)
		out = append(out, c)
	}
	return out, nil
}
