package a2a

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/conclave-ai/conclave/pkg/store"
)

// TasksTable holds one record per A2A task: what names it (its request,
// thread, agent and client) and its last known state. What the task said
// (its messages and artifacts) is the thread's history, not kept twice.
var TasksTable = store.Table{Name: "gateway-a2a-tasks"}

const taskSK = "task"

// taskRecord is a task as stored. Its id is the gateway request_id that
// answers it: the request_id names the replica that assigned it, so that
// a cancel reaches that replica.
type taskRecord struct {
	TaskID    string `json:"task_id"`
	ContextID string `json:"context_id"`
	AgentID   string `json:"agent_id"`
	ClientID  string `json:"client_id"`
	// MessageEntry is the entry_id of the client's message in the thread:
	// where the task's entries begin.
	MessageEntry string `json:"message_entry"`
	// MessageID is the client's messageId, which the history does not keep.
	MessageID string        `json:"message_id"`
	State     a2a.TaskState `json:"state"`
	// StatusText says why a task failed or was canceled.
	StatusText string    `json:"status_text,omitempty"`
	Created    time.Time `json:"created"`
	Updated    time.Time `json:"updated"`

	version int64
}

func taskKey(id string) store.Key { return store.Key{PK: "task/" + id, SK: taskSK} }

// tasks keeps task records in the store. Every update is conditioned on
// the version read, so that of two replicas finishing one task (the one
// streaming it and one answering GetTask) one writes and the other rereads.
type tasks struct {
	st  store.Store
	ttl time.Duration // 0: kept until deleted
	now func() time.Time
}

// errTaskNotFound is a record that does not exist (or expired).
var errTaskNotFound = errors.New("a2a: task not found")

func (t *tasks) expiry(now time.Time) time.Time {
	if t.ttl <= 0 {
		return time.Time{}
	}
	return now.Add(t.ttl)
}

func (t *tasks) item(r *taskRecord) (store.Item, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return store.Item{}, err
	}
	return store.Item{Key: taskKey(r.TaskID), Data: data, ExpiresAt: t.expiry(r.Updated)}, nil
}

// create writes a new task's record, unless one exists: a message whose
// messageId was seen before is answered by the same request, so the same
// task. It returns the record as stored.
func (t *tasks) create(ctx context.Context, r *taskRecord) (*taskRecord, error) {
	r.Created, r.Updated = t.now(), t.now()
	it, err := t.item(r)
	if err != nil {
		return nil, err
	}
	stored, err := t.st.Put(ctx, TasksTable.Name, it, store.IfNotExists())
	if errors.Is(err, store.ErrConditionFailed) {
		return t.get(ctx, r.TaskID)
	}
	if err != nil {
		return nil, fmt.Errorf("creating task %s: %w", r.TaskID, err)
	}
	r.version = stored.Version
	return r, nil
}

func (t *tasks) get(ctx context.Context, id string) (*taskRecord, error) {
	it, err := t.st.Get(ctx, TasksTable.Name, taskKey(id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, errTaskNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading task %s: %w", id, err)
	}
	r := &taskRecord{}
	if err := json.Unmarshal(it.Data, r); err != nil {
		return nil, fmt.Errorf("task %s: malformed record: %w", id, err)
	}
	r.version = it.Version
	return r, nil
}

// finish records a task's terminal state, unless it is terminal already.
// It reports whether this call recorded it.
func (t *tasks) finish(ctx context.Context, id string, state a2a.TaskState, text string) (bool, error) {
	for range 5 {
		r, err := t.get(ctx, id)
		if err != nil {
			return false, err
		}
		if r.State.Terminal() {
			return false, nil
		}
		r.State, r.StatusText, r.Updated = state, text, t.now()
		it, err := t.item(r)
		if err != nil {
			return false, err
		}
		_, err = t.st.Put(ctx, TasksTable.Name, it, store.IfVersion(r.version))
		if errors.Is(err, store.ErrConditionFailed) {
			continue // another replica updated it meanwhile: read it again
		}
		if err != nil {
			return false, fmt.Errorf("finishing task %s: %w", id, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("finishing task %s: %w", id, store.ErrConditionFailed)
}
