// Package records keeps the runner's state in pkg/store: instances, tasks
// and instance logs, in one table.
package records

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/pkg/store"
)

// Table holds every record of the runner.
var Table = store.Table{Name: "runner"}

// Statuses of an instance (as Kandev's REST API has them).
const (
	StatusStarting  = "starting"
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusStopped   = "stopped"
	// StatusAwaitingApproval: a turn waits for a person to decide a
	// permission request the Librarian escalated (Approval says which).
	StatusAwaitingApproval = "awaiting_approval"
)

// Approval is a permission request of the instance's agent that waits for
// a person's decision: the Librarian's request, and when the wait ends. It
// is kept with the instance so that a runner that restarts mid-wait takes
// the wait up again with the same request and deadline.
type Approval struct {
	RequestID string `json:"request_id"`
	ReviewURL string `json:"review_url,omitempty"`
	// Key is the request's idempotency key; Turn the turn that asked.
	Key        string    `json:"key"`
	Turn       int       `json:"turn"`
	ToolCallID string    `json:"tool_call_id,omitempty"`
	Title      string    `json:"title,omitempty"`
	Since      time.Time `json:"since"`
	Deadline   time.Time `json:"deadline"`
}

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
	// Approval is the permission request a turn waits on while the status
	// is awaiting_approval.
	Approval *Approval `json:"approval,omitempty"`
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

// listPK is the partition of the instance list: one item per instance,
// sorted by launch time, so that a query in reverse lists the newest first.
const listPK = "instances"

// listKey is in's item in the instance list: its launch time in
// nanoseconds (fixed width, so that the sort key sorts by time), then its
// id. StartedAt is set at launch and never changes.
func listKey(in *Instance) store.Key {
	return store.Key{PK: listPK, SK: fmt.Sprintf("%020d#%s", in.StartedAt.UnixNano(), in.ID)}
}

// CreateInstance writes a new instance and its item in the instance list;
// it fails if the id exists. The store has no transactions, so the list
// item is written first: an instance is never missing from the list, and
// a list item whose instance never came (the runner died between the two
// writes) is passed over by ListInstances and removed.
func (r *Records) CreateInstance(ctx context.Context, in *Instance) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	lk := listKey(in)
	if _, err := r.st.Put(ctx, Table.Name, store.Item{Key: lk, Attrs: map[string]string{"agent_type": in.AgentType}}); err != nil {
		return fmt.Errorf("listing instance %s: %w", in.ID, err)
	}
	it, err := r.st.Put(ctx, Table.Name, store.Item{Key: instanceKey(in.ID), Data: data}, store.IfNotExists())
	if err != nil {
		// Its own list item, never the existing instance's: the launch
		// times differ. Only when the instance surely was not written: a
		// write that timed out may still have landed, and its list item
		// must stay (a stray is passed over and cleaned by the listing).
		if errors.Is(err, store.ErrConditionFailed) || errors.Is(err, store.ErrInvalid) || errors.Is(err, store.ErrItemTooLarge) {
			_ = r.st.Delete(context.WithoutCancel(ctx), Table.Name, lk)
		}
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

// DeleteInstance removes the instance, its item in the instance list and
// its logs. The instance goes first, so that it is off the list at once
// (ListInstances passes over a list item without its instance).
func (r *Records) DeleteInstance(ctx context.Context, id string) error {
	in, err := r.Instance(ctx, id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	if err := r.st.Delete(ctx, Table.Name, instanceKey(id)); err != nil {
		return err
	}
	if in != nil {
		if err := r.st.Delete(ctx, Table.Name, listKey(in)); err != nil {
			return err
		}
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

// ListOptions selects instances for ListInstances.
type ListOptions struct {
	// Status and AgentType, when set, keep only instances with them.
	Status, AgentType string
	// Limit is the most instances to return, 1 to 1000.
	Limit int
	// After continues a listing: a previous InstancePage.Next.
	After string
	// MaxScan bounds the list items one call reads (filters may pass over
	// many); 0 means 1000.
	MaxScan int
}

// InstancePage is a page of instances, newest launch first.
type InstancePage struct {
	Instances []*Instance
	// Next continues the listing (ListOptions.After); empty at its end.
	Next string
}

// strayAge is how old a list item without its instance must be before
// ListInstances removes it: well past the moment between the two writes
// of CreateInstance.
const strayAge = 10 * time.Minute

// ValidListPosition reports whether s can be a ListOptions.After.
func ValidListPosition(s string) bool {
	ns, id, ok := strings.Cut(s, "#")
	if !ok || len(ns) != 20 || id == "" || len(id) > 128 || strings.ContainsAny(id, "#/\x00") || !utf8.ValidString(id) {
		return false
	}
	_, err := strconv.ParseUint(ns, 10, 64)
	return err == nil
}

// ListInstances returns instances newest first, skipping deleted ones. A
// page may hold fewer than opts.Limit instances, even none, with Next set,
// when the filters passed over opts.MaxScan list items.
func (r *Records) ListInstances(ctx context.Context, opts ListOptions) (InstancePage, error) {
	if opts.Limit < 1 || opts.Limit > 1000 {
		return InstancePage{}, fmt.Errorf("list limit %d is outside 1..1000: %w", opts.Limit, store.ErrInvalid)
	}
	if opts.After != "" && !ValidListPosition(opts.After) {
		return InstancePage{}, fmt.Errorf("malformed list position: %w", store.ErrInvalid)
	}
	maxScan := cmp.Or(opts.MaxScan, 1000)
	var (
		out     InstancePage
		cursor  string
		scanned int
	)
	for {
		q := store.Query{PK: listPK, Reverse: true, To: opts.After, Cursor: cursor,
			Limit: min(max(opts.Limit-len(out.Instances), 1)+1, maxScan-scanned, 1000)}
		page, err := r.st.Query(ctx, Table.Name, q)
		if err != nil {
			return InstancePage{}, err
		}
		var keys []store.Key
		for _, it := range page.Items {
			if it.SK != opts.After && (opts.AgentType == "" || it.Attrs["agent_type"] == opts.AgentType) {
				_, id, _ := strings.Cut(it.SK, "#")
				keys = append(keys, instanceKey(id))
			}
		}
		found := map[string]store.Item{}
		if len(keys) > 0 {
			got, err := r.st.BatchGet(ctx, Table.Name, keys)
			if err != nil {
				return InstancePage{}, err
			}
			for _, it := range got {
				found[it.PK] = it
			}
		}
		for i, it := range page.Items {
			scanned++
			out.Next = it.SK
			if it.SK == opts.After || opts.AgentType != "" && it.Attrs["agent_type"] != opts.AgentType {
				continue
			}
			ns, id, _ := strings.Cut(it.SK, "#")
			data, ok := found[instanceKey(id).PK]
			var in Instance
			if ok && json.Unmarshal(data.Data, &in) == nil && listKey(&in) == it.Key {
				in.version = data.Version
				if in.Deleted || opts.Status != "" && in.Status != opts.Status {
					continue
				}
				out.Instances = append(out.Instances, &in)
				if len(out.Instances) == opts.Limit {
					if i == len(page.Items)-1 && page.Cursor == "" {
						out.Next = ""
					}
					return out, nil
				}
				continue
			}
			// A list item without its instance: a deletion half done, or
			// a creation that never finished once it is old enough.
			if n, err := strconv.ParseInt(ns, 10, 64); err == nil && time.Since(time.Unix(0, n)) > strayAge {
				_ = r.st.Delete(ctx, Table.Name, it.Key)
			}
		}
		if page.Cursor == "" {
			out.Next = ""
			return out, nil
		}
		if scanned >= maxScan {
			return out, nil
		}
		cursor = page.Cursor
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
