package a2a

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
)

// handler is the A2A request handler over the client API. The caller is
// authenticated and within its limits already (Server.serveRPC).
type handler struct{ s *Server }

var _ a2asrv.RequestHandler = (*handler)(nil)

// errStop ends a client API stream whose A2A caller stopped reading.
var errStop = errors.New("a2a: the caller stopped reading")

// finishTimeout bounds the write of a task's end, which goes on when the
// caller has left.
const finishTimeout = 10 * time.Second

// gatewayError is a client API error in A2A's terms. Its message is the
// status's, which the client API writes for callers (causes are hidden).
func gatewayError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st := status.Convert(err)
	kind := a2a.ErrInternalError
	switch st.Code() {
	case codes.InvalidArgument, codes.AlreadyExists, codes.OutOfRange:
		kind = a2a.ErrInvalidParams
	case codes.Unauthenticated:
		kind = a2a.ErrUnauthenticated
	case codes.PermissionDenied:
		kind = a2a.ErrUnauthorized
	case codes.Unimplemented:
		kind = a2a.ErrUnsupportedOperation
	case codes.NotFound, codes.ResourceExhausted, codes.Unavailable, codes.Aborted, codes.FailedPrecondition, codes.DeadlineExceeded:
		// No A2A error names an agent that is not connected, a full
		// queue or a replica that is gone: they are the server's.
		kind = a2a.ErrServerError
	case codes.Canceled:
		return context.Canceled
	}
	return a2a.NewError(kind, st.Message())
}

func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// storeError is a task store failure: logged, and answered without it.
func (h *handler) storeError(ctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	h.s.log.ErrorContext(ctx, "A2A task store failed", "error", err)
	return a2a.NewError(a2a.ErrServerError, "the gateway's store is unavailable; retry")
}

// run sends msg to the agent of ctx and relays the answer to emit as A2A
// events: first the task (submitted), then its updates, until it ends, or
// emit returns false, or, when immediate, right after the task. It returns
// the task as the events made it, or the error of a message the client
// API refused.
func (h *handler) run(ctx context.Context, msg *a2a.Message, emit func(a2a.Event) bool, immediate bool) (*translator, error) {
	req, err := toRequest(agentFrom(ctx), msg)
	if err != nil {
		return nil, err
	}
	var tr *translator
	var failure error
	stopped := false
	stream := &localStream[gatewayv1.SendMessageResponse]{ctx: ctx, send: func(m *gatewayv1.SendMessageResponse) error {
		if tr == nil {
			info := a2a.TaskInfo{TaskID: a2a.TaskID(m.GetRequestId()), ContextID: m.GetThreadId()}
			user := *msg
			user.TaskID, user.ContextID = info.TaskID, info.ContextID
			tr = newTranslator(info, []*a2a.Message{&user}, h.s.now)
			if _, err := h.s.tasks.create(ctx, &taskRecord{
				TaskID: m.GetRequestId(), ContextID: m.GetThreadId(), AgentID: req.GetAgentId(),
				ClientID: auth.ClientID(ctx), MessageEntry: m.GetEntryId(), MessageID: msg.ID, State: a2a.TaskStateSubmitted,
			}); err != nil {
				failure = h.storeError(ctx, err)
				return status.Error(codes.Unavailable, "the gateway's store is unavailable")
			}
			if !emit(tr.snapshot()) || immediate {
				stopped = true
				return errStop
			}
		}
		for _, ev := range tr.event(m.GetEvent(), nil) {
			if !emit(ev) {
				stopped = true
				return errStop
			}
		}
		return nil
	}}
	err = h.s.api.SendMessage(req, stream)
	switch {
	case failure != nil:
		return nil, failure
	case tr == nil && err != nil:
		return nil, gatewayError(err)
	case tr == nil:
		return nil, a2a.NewError(a2a.ErrInternalError, "the agent's answer ended before it began")
	case stopped:
		return tr, nil
	}
	if err != nil && ctx.Err() == nil {
		for _, ev := range tr.ended(err) {
			emit(ev)
		}
	}
	h.finish(ctx, tr)
	return tr, nil
}

// finish records the end of a task the translator saw end.
func (h *handler) finish(ctx context.Context, tr *translator) {
	if !tr.terminal() {
		return
	}
	st := tr.task.Status
	text := ""
	if st.Message != nil && len(st.Message.Parts) > 0 {
		text = st.Message.Parts[0].Text()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	wrote, err := h.s.tasks.finish(ctx, string(tr.info.TaskID), st.State, text)
	if err != nil {
		h.s.log.WarnContext(ctx, "could not record the end of an A2A task; GetTask reads it from the history", "task_id", tr.info.TaskID, "error", err)
		return
	}
	if wrote {
		h.s.m.A2ATask(taskStateName(st.State))
	}
}

// taskStateName is a state as the metrics name it.
func taskStateName(s a2a.TaskState) string {
	switch s {
	case a2a.TaskStateCompleted:
		return "completed"
	case a2a.TaskStateFailed:
		return "failed"
	case a2a.TaskStateCanceled:
		return "canceled"
	}
	return "other"
}

// SendMessage implements a2asrv.RequestHandler: it waits for the task's
// end, or, as A2A asks, for it to be interrupted (input-required), unless
// configuration.returnImmediately (0.3: blocking false) asks for the task
// as soon as it is submitted; it then goes on, for GetTask and
// SubscribeToTask. Without history a request ends with its caller, so
// SendMessage then waits through an interruption to the end.
func (h *handler) SendMessage(ctx context.Context, req *a2a.SendMessageRequest) (a2a.SendMessageResult, error) {
	immediate := req.Config != nil && req.Config.ReturnImmediately
	tr, err := h.run(ctx, req.Message, func(ev a2a.Event) bool { return h.s.hist == nil || !interrupted(ev) }, immediate)
	if err != nil {
		return nil, err
	}
	task := tr.snapshot()
	if req.Config != nil {
		trimHistory(task, req.Config.HistoryLength)
	}
	return task, nil
}

// SendStreamingMessage implements a2asrv.RequestHandler.
func (h *handler) SendStreamingMessage(ctx context.Context, req *a2a.SendMessageRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		if _, err := h.run(ctx, req.Message, func(ev a2a.Event) bool { return yield(ev, nil) }, false); err != nil {
			yield(nil, err)
		}
	}
}

// interrupted reports whether ev moves the task to input-required.
func interrupted(ev a2a.Event) bool {
	u, ok := ev.(*a2a.TaskStatusUpdateEvent)
	return ok && u.Status.State == a2a.TaskStateInputRequired
}

func trimHistory(t *a2a.Task, n *int) {
	if n == nil || *n < 0 {
		return
	}
	if *n < len(t.History) {
		t.History = t.History[len(t.History)-*n:]
	}
}

// task is the record of task id, if the caller may read it: its client's
// or an admin's, at its agent's endpoint. Another client's task, or one
// asked of another agent, is not found, as one that does not exist.
func (h *handler) task(ctx context.Context, id a2a.TaskID) (*taskRecord, error) {
	if err := ids.RequestID.Check(string(id)); err != nil {
		return nil, invalidParams("id: " + err.Error())
	}
	rec, err := h.s.tasks.get(ctx, string(id))
	if errors.Is(err, errTaskNotFound) {
		return nil, a2a.NewError(a2a.ErrTaskNotFound, fmt.Sprintf("task %s not found", id))
	}
	if err != nil {
		return nil, h.storeError(ctx, err)
	}
	// A task is its client's, and is reached at its agent's endpoint.
	if c := auth.ClientID(ctx); (rec.ClientID != c && !h.s.admins[c]) || rec.AgentID != agentFrom(ctx) {
		return nil, a2a.NewError(a2a.ErrTaskNotFound, fmt.Sprintf("task %s not found", id))
	}
	return rec, nil
}

// stored is the task as its record and its stored entries make it, and
// the id of its last stored entry.
func (h *handler) stored(ctx context.Context, rec *taskRecord) (*translator, string, error) {
	info := a2a.TaskInfo{TaskID: a2a.TaskID(rec.TaskID), ContextID: rec.ContextID}
	tr := newTranslator(info, nil, h.s.now)
	last := rec.MessageEntry
	if h.s.hist != nil && rec.MessageEntry != "" {
		ref, err := history.ParseEntryRef(rec.MessageEntry)
		if err != nil {
			return nil, "", h.storeError(ctx, err)
		}
		from := uint32(0)
		for {
			entries, more, err := h.s.hist.RequestEntries(ctx, rec.ContextID, ref, from, 100)
			if err != nil {
				return nil, "", h.storeError(ctx, err)
			}
			for _, e := range entries {
				if m := e.GetMessage(); m != nil {
					tr.task.History = []*a2a.Message{userMessage(info, rec.MessageID, m)}
				} else {
					tr.entry(e)
				}
				last = e.GetEntryId()
				if seq, _, err := history.Seq(last); err == nil {
					from = seq + 1
				}
			}
			if !more || len(entries) == 0 {
				break
			}
		}
	}
	if !tr.terminal() && rec.State.Terminal() {
		// The record knows the end the history does not (kept none).
		var parts []*a2a.Part
		if rec.StatusText != "" {
			parts = append(parts, a2a.NewTextPart(rec.StatusText))
		}
		tr.status(rec.State, nil, parts...)
		ts := rec.Updated
		tr.task.Status.Timestamp = &ts
	}
	tr.task.Metadata = map[string]any{"agent_id": rec.AgentID}
	return tr, last, nil
}

// GetTask implements a2asrv.RequestHandler. It reads the task from the
// store, so any replica answers it; the events of a task still running
// are there up to the history's flush interval late. A task found ended
// in the history is recorded as ended.
func (h *handler) GetTask(ctx context.Context, req *a2a.GetTaskRequest) (*a2a.Task, error) {
	rec, err := h.task(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	tr, _, err := h.stored(ctx, rec)
	if err != nil {
		return nil, err
	}
	if !rec.State.Terminal() {
		h.finish(ctx, tr)
	}
	task := tr.snapshot()
	trimHistory(task, req.HistoryLength)
	return task, nil
}

// follow sends the task's stored state to emit (the task), then its
// events live, from the replica answering it, until it ends.
func (h *handler) follow(ctx context.Context, rec *taskRecord, emit func(a2a.Event) bool) (*translator, error) {
	tr, last, err := h.stored(ctx, rec)
	if err != nil {
		return nil, err
	}
	if !emit(tr.snapshot()) {
		return tr, nil
	}
	if tr.terminal() {
		h.finish(ctx, tr)
		return tr, nil
	}
	stopped := false
	stream := &localStream[gatewayv1.WatchThreadResponse]{ctx: ctx, send: func(m *gatewayv1.WatchThreadResponse) error {
		for _, ev := range tr.entry(m.GetEntry()) {
			if !emit(ev) {
				stopped = true
				return errStop
			}
		}
		return nil
	}}
	err = h.s.api.WatchThread(&gatewayv1.WatchThreadRequest{ThreadId: rec.ContextID, After: last, RequestId: rec.TaskID}, stream)
	if stopped || ctx.Err() != nil {
		return tr, nil
	}
	if err != nil {
		return nil, gatewayError(err)
	}
	if !tr.terminal() {
		// The request's replica stopped before it ended, and nothing more
		// will come.
		for _, ev := range tr.ended(status.Error(codes.Unavailable, "the gateway replica answering the task stopped before it ended")) {
			emit(ev)
		}
	}
	h.finish(ctx, tr)
	return tr, nil
}

// SubscribeToTask implements a2asrv.RequestHandler: the task, then its
// events as they come, on whichever replica the caller reached.
func (h *handler) SubscribeToTask(ctx context.Context, req *a2a.SubscribeToTaskRequest) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		rec, err := h.task(ctx, req.ID)
		if err != nil {
			yield(nil, err)
			return
		}
		if h.s.hist == nil {
			yield(nil, a2a.NewError(a2a.ErrUnsupportedOperation, "this gateway keeps no history, so a task cannot be followed"))
			return
		}
		if rec.State.Terminal() {
			yield(nil, a2a.NewError(a2a.ErrUnsupportedOperation, fmt.Sprintf("task %s has ended (%s); read it with GetTask", rec.TaskID, taskStateName(rec.State))))
			return
		}
		if _, err := h.follow(ctx, rec, func(ev a2a.Event) bool { return yield(ev, nil) }); err != nil {
			yield(nil, err)
		}
	}
}

// CancelTask implements a2asrv.RequestHandler: the client API's
// CancelMessage, at the replica that assigned the request; then it waits
// (CancelWait at most) for the agent to end the task, and answers the task
// as it then stands.
func (h *handler) CancelTask(ctx context.Context, req *a2a.CancelTaskRequest) (*a2a.Task, error) {
	rec, err := h.task(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	if rec.State.Terminal() {
		return nil, a2a.NewError(a2a.ErrTaskNotCancelable, fmt.Sprintf("task %s has ended (%s)", rec.TaskID, taskStateName(rec.State)))
	}
	if _, err := h.s.api.CancelMessage(ctx, &gatewayv1.CancelMessageRequest{RequestId: rec.TaskID, Reason: "canceled by its A2A client"}); err != nil {
		return nil, gatewayError(err)
	}
	if h.s.hist == nil {
		tr, _, err := h.stored(ctx, rec)
		if err != nil {
			return nil, err
		}
		return tr.snapshot(), nil
	}
	wctx, cancel := context.WithTimeout(ctx, h.s.opts.CancelWait)
	defer cancel()
	tr, err := h.follow(wctx, rec, func(a2a.Event) bool { return true })
	if err != nil {
		return nil, err
	}
	if !tr.terminal() {
		// The agent has not ended it yet: the task as stored now.
		if tr, _, err = h.stored(ctx, rec); err != nil {
			return nil, err
		}
	}
	return tr.snapshot(), nil
}

// ListTasks implements a2asrv.RequestHandler: not served; a thread's
// tasks are its requests, listed by the client API's History.
func (h *handler) ListTasks(context.Context, *a2a.ListTasksRequest) (*a2a.ListTasksResponse, error) {
	return nil, a2a.NewError(a2a.ErrUnsupportedOperation, "ListTasks is not supported; read a context's history with GET /v1/threads/{contextId}/messages")
}

// GetTaskPushConfig implements a2asrv.RequestHandler.
func (h *handler) GetTaskPushConfig(context.Context, *a2a.GetTaskPushConfigRequest) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// ListTaskPushConfigs implements a2asrv.RequestHandler.
func (h *handler) ListTaskPushConfigs(context.Context, *a2a.ListTaskPushConfigRequest) (*a2a.ListTaskPushConfigResponse, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// CreateTaskPushConfig implements a2asrv.RequestHandler.
func (h *handler) CreateTaskPushConfig(context.Context, *a2a.PushConfig) (*a2a.PushConfig, error) {
	return nil, a2a.ErrPushNotificationNotSupported
}

// DeleteTaskPushConfig implements a2asrv.RequestHandler.
func (h *handler) DeleteTaskPushConfig(context.Context, *a2a.DeleteTaskPushConfigRequest) error {
	return a2a.ErrPushNotificationNotSupported
}

// GetExtendedAgentCard implements a2asrv.RequestHandler.
func (h *handler) GetExtendedAgentCard(context.Context, *a2a.GetExtendedAgentCardRequest) (*a2a.AgentCard, error) {
	return nil, a2a.ErrExtendedCardNotConfigured
}
