package clientapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/server"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
	"github.com/conclave-ai/conclave/services/gateway/internal/metrics"
)

// Defaults of the history settings.
const (
	// DefaultDetachedTimeout is how long a request goes on once no client
	// follows it.
	DefaultDetachedTimeout = 10 * time.Minute
	// endTimeout bounds the retries of a request's last write: they end
	// between endTimeout-endSlack and endTimeout after the first.
	endTimeout = 10 * time.Second
	endSlack   = time.Second
	// maxPendingBytes bounds what a request keeps in memory while the
	// store refuses its writes; past it the request is cancelled.
	maxPendingBytes    = 8 << 20
	defaultEntriesPage = 100
	maxEntriesPage     = 1000
)

// WithHistory keeps every exchange in h, replays a repeated idempotency
// key's answer from it, and serves History, ListThreads and WatchThread.
// A request then goes on when its client leaves, for another to follow,
// until detached (zero: DefaultDetachedTimeout) has passed with no client
// following it; then it is cancelled.
func WithHistory(h *history.Store, detached time.Duration) Option {
	if detached <= 0 {
		detached = DefaultDetachedTimeout
	}
	return func(s *Server) { s.hist, s.detached = h, detached }
}

// WithAdmins names the clients (auth.ClientID) that may read every
// thread; the others read only the threads they started.
func WithAdmins(clientIDs ...string) Option {
	return func(s *Server) {
		s.admins = map[string]bool{}
		for _, id := range clientIDs {
			s.admins[id] = true
		}
	}
}

// mayRead reports whether the caller may read a thread owner started.
func (s *Server) mayRead(ctx context.Context, owner string) bool {
	id := auth.ClientID(ctx)
	return id == owner || s.admins[id]
}

// historyError is the status of a history error for threadID.
func historyError(err error, threadID string) error {
	switch {
	case errors.Is(err, history.ErrNotFound):
		return status.Errorf(codes.NotFound, "thread %q not found", threadID)
	case errors.Is(err, history.ErrNotOwner):
		return status.Errorf(codes.PermissionDenied, "thread %q belongs to another client", threadID)
	case errors.Is(err, history.ErrBadCursor):
		return status.Error(codes.InvalidArgument, "after or page_token is not one this gateway issued")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return server.Hide(status.New(codes.Unavailable, "the gateway's history store is unavailable; retry"), err)
}

// sendRecorded is SendMessage with history. A repeated idempotency key is
// answered from the history of the request that first carried it. A new
// message is sent to the agent by the replica holding it, and recorded
// with its answer by the request's own handler, which relays the answer
// to its caller: nothing before the message is stored (the first write,
// with the answer's first events), then each event as it comes. When the
// caller leaves, a goroutine records the rest, for a reconnecting client
// to follow.
func (s *Server) sendRecorded(req *gatewayv1.SendMessageRequest, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	ctx, agentID, key := stream.Context(), req.GetAgentId(), req.GetIdempotencyKey()
	if key != "" {
		prev, err := s.idem.lookup(ctx, agentID, key)
		if err != nil {
			s.metrics.Request(metrics.Refused)
			return err
		}
		if prev != nil {
			return s.replay(req, prev, stream)
		}
	}
	if !s.agents.Holds(agentID) {
		return s.sendElsewhere(req, stream)
	}
	threadID := req.GetThreadId()
	if threadID == "" {
		threadID = history.NewThreadID()
	}
	client := auth.ClientID(ctx)
	if err := s.hist.Join(ctx, threadID, client, agentID); err != nil {
		s.metrics.Request(metrics.Refused)
		return historyError(err, threadID)
	}
	requestID, start := agentstream.NewRequestID(s.serverID), time.Now()
	ref := history.MessageRef(requestID, start)
	var c *claim
	if key != "" {
		var prev *sent
		var err error
		if c, prev, err = s.idem.claim(ctx, agentID, key, requestID, threadID, ref.String()); err != nil {
			if prev != nil {
				// Claimed by a request that came at the same moment.
				return s.replay(req, prev, stream)
			}
			s.metrics.Request(metrics.Refused)
			return err
		}
	}
	rec, err := s.hist.Begin(history.Exchange{
		ThreadID: threadID, RequestID: requestID, AgentID: agentID, ClientID: client,
		Sender: req.GetSender(), Content: req.GetContent(), Attachments: req.GetAttachments(), Start: start,
	})
	if err != nil {
		if c != nil {
			s.release(c)
		}
		s.metrics.Request(metrics.Refused)
		return status.Error(codes.InvalidArgument, err.Error())
	}
	msg := &covenpb.SendMessage{
		RequestId: requestID, ThreadId: threadID, Sender: req.GetSender(), Content: req.GetContent(), Attachments: req.GetAttachments(),
	}
	// The request outlives its caller: only its recorder ends it.
	r, err := s.agents.Send(context.WithoutCancel(ctx), agentID, msg)
	if err != nil {
		rec.Discard()
		if c != nil {
			s.release(c)
		}
		switch status.Code(err) {
		case codes.NotFound:
			return s.sendElsewhere(req, stream)
		case codes.ResourceExhausted:
			s.metrics.Request(metrics.QueueFull)
		default:
			s.metrics.Request(metrics.Refused)
		}
		return err
	}
	s.recorders.Add(1)
	rc := &recorder{s: s, rec: rec, r: r, start: start, c: c, flush: time.NewTimer(s.hist.FirstFlush()), first: true}
	return rc.attached(ctx, stream, &gatewayv1.SendMessageResponse{RequestId: requestID, ThreadId: threadID, EntryId: ref.String()})
}

// recorder records a request's answer as it comes, until the request
// ends: first as the request's handler, relaying it to the caller, then,
// once the caller left, on a goroutine of its own. It counts the
// request's outcome and times it from start. A key claimed for a request
// that ended before it reached the agent is given back.
type recorder struct {
	s     *Server
	rec   *history.Recording
	r     *agentstream.Request
	start time.Time
	c     *claim
	// flush fires when what waits in memory is due to be written: the
	// client's message with the answer's first events, then each batch.
	flush            *time.Timer
	first, cancelled bool
}

// attached records the answer and relays it to the caller, header first:
// each entry once the client's message is stored (so a caller is never
// told of a message a dying replica would lose), the end once it is
// stored too. When the caller leaves, the recording goes on without it.
func (rc *recorder) attached(ctx context.Context, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse], header *gatewayv1.SendMessageResponse) error {
	s, rec := rc.s, rc.rec
	rec.SetAttached(true)
	var unsent []*gatewayv1.ThreadEntry // recorded, not sent yet
	for {
		var (
			ended  bool
			endErr error
		)
		select {
		case ev, ok := <-rc.r.Events:
			unsent, ended, endErr = rc.event(ev, ok, unsent)
		case <-rc.flush.C:
			rc.flushDue()
		case <-ctx.Done():
			rc.detach()
			return status.FromContextError(ctx.Err()).Err()
		}
		if !rec.Stored() {
			if ended {
				// The end, and so the message, could not be stored.
				return historyError(endErr, rec.ThreadID())
			}
			continue
		}
		if header != nil {
			if err := stream.Send(header); err != nil {
				return rc.left(ended, fmt.Errorf("streaming to client: %w", err))
			}
			header = nil
		}
		for _, e := range unsent {
			if _, err := s.sendEntry(stream, e, false); err != nil {
				if _, isOutcome := e.GetEntry().(*gatewayv1.ThreadEntry_Outcome); isOutcome {
					return err // the request's own ending
				}
				return rc.left(ended, err)
			}
		}
		clear(unsent)
		unsent = unsent[:0]
		if ended {
			if endErr != nil {
				return historyError(endErr, rec.ThreadID())
			}
			return nil
		}
	}
}

// left hands the recording over to a goroutine when the caller is gone
// before the request ended, and returns err.
func (rc *recorder) left(ended bool, err error) error {
	if !ended {
		rc.detach()
	}
	return err
}

// detach goes on recording without the caller, on a goroutine, until the
// request ends or no client followed it for the detached timeout.
func (rc *recorder) detach() {
	rc.rec.SetAttached(false)
	rc.s.detach(rc.rec)
	go rc.run()
}

// run records the rest of the answer.
func (rc *recorder) run() {
	var recorded []*gatewayv1.ThreadEntry
	for {
		select {
		case ev, ok := <-rc.r.Events:
			var ended bool
			if recorded, ended, _ = rc.event(ev, ok, recorded[:0]); ended {
				return
			}
		case <-rc.flush.C:
			rc.flushDue()
		}
	}
}

// event records what came from the agent (ok false: the events ended),
// and appends the entries recorded to recorded. ended reports that the
// request ended, endErr that its end could not be stored.
func (rc *recorder) event(ev agentstream.Event, ok bool, recorded []*gatewayv1.ThreadEntry) (_ []*gatewayv1.ThreadEntry, ended bool, endErr error) {
	s, rec, r := rc.s, rc.rec, rc.r
	var (
		terminal *covenpb.MessageResponse
		outcome  *gatewayv1.Outcome
		metric   string
	)
	switch {
	case !ok || ev.Err != nil:
		err := ev.Err
		if err == nil {
			err = status.Error(codes.Unavailable, "the request ended without an answer")
		}
		st := status.Convert(err)
		outcome, metric = &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_AGENT_GONE, Code: int32(st.Code()), Message: st.Message()}, metrics.AgentGone
	default:
		if rc.first {
			rc.first = false
			s.metrics.FirstEvent(time.Since(rc.start))
		}
		switch ev.Response.GetEvent().(type) {
		case *covenpb.MessageResponse_Done:
			terminal, outcome, metric = ev.Response, &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_DONE}, metrics.Done
		case *covenpb.MessageResponse_Error:
			terminal, outcome, metric = ev.Response, &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_ERROR}, metrics.AgentError
		case *covenpb.MessageResponse_Cancelled:
			terminal, outcome, metric = ev.Response, &gatewayv1.Outcome{Ending: gatewayv1.Ending_ENDING_CANCELLED}, metrics.Cancelled
		}
	}
	if outcome != nil {
		got, err := rc.end(terminal, outcome, metric)
		return append(recorded, got...), true, err
	}
	e, err := rec.Append(context.Background(), ev.Response, len(r.Events) > 0)
	if err != nil {
		s.log.Warn("could not record events of a request; retrying with the next ones", "request_id", r.ID, "error", err)
		if rec.Pending() > maxPendingBytes && !rc.cancelled {
			rc.cancelled = true
			s.agents.Cancel(context.Background(), r.ID, "the gateway cannot record the answer")
		}
	}
	return append(recorded, e), false, nil
}

// flushDue writes what waits in memory, and sets the next flush.
func (rc *recorder) flushDue() {
	if err := rc.rec.Flush(context.Background()); err != nil {
		rc.s.log.Warn("could not record events of a request; retrying", "request_id", rc.r.ID, "error", err)
	}
	rc.flush.Reset(rc.s.hist.FlushInterval())
}

// end records the request's end and counts it.
func (rc *recorder) end(terminal *covenpb.MessageResponse, outcome *gatewayv1.Outcome, metric string) ([]*gatewayv1.ThreadEntry, error) {
	s, r := rc.s, rc.r
	defer s.recorders.Done()
	rc.flush.Stop()
	got, err := rc.rec.End(s.ends.get(time.Now()), terminal, outcome)
	if err != nil {
		s.log.Error("could not record the end of a request; its callers are told it failed", "request_id", r.ID, "thread_id", rc.rec.ThreadID(), "error", err)
	}
	s.metrics.Request(metric)
	s.metrics.Finished(time.Since(rc.start))
	if rc.c != nil && r.Abandon() {
		s.release(rc.c)
	}
	return got, err
}

// endContexts hands out the contexts that bound the last write of the
// requests that end: one a second, shared by every request that ends in
// that second, since a context with a deadline costs a timer.
type endContexts struct {
	mu    sync.Mutex
	ctx   context.Context
	until time.Time // when ctx stops being handed out
	// cancel is the latest context's; none is cancelled before its
	// deadline, as requests still use it.
	cancel context.CancelFunc
}

// get returns a context that ends between endTimeout-endSlack and
// endTimeout from now.
func (c *endContexts) get(now time.Time) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || !now.Before(c.until) {
		c.ctx, c.cancel = context.WithDeadline(context.Background(), now.Add(endTimeout))
		c.until = now.Add(endSlack)
	}
	return c.ctx
}

// detach cancels rec's request if no client follows it for the detached
// timeout from now.
func (s *Server) detach(rec *history.Recording) {
	id := rec.Message().RequestID()
	time.AfterFunc(s.detached, func() {
		if s.hist.Live(id) == rec && rec.Followers() == 0 {
			s.agents.Cancel(context.Background(), id, fmt.Sprintf("no client followed the request for %s", s.detached))
		}
	})
}

// Drain waits until every request's recording has ended, or ctx ends.
func (s *Server) Drain(ctx context.Context) {
	done := make(chan struct{})
	go func() { s.recorders.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// relayRecording replays a request this replica is answering to a
// caller that repeated its idempotency key: first (the stream's first
// response), once the request's message is stored, then sub's entries,
// until the request ends or the caller leaves.
func (s *Server) relayRecording(ctx context.Context, rec *history.Recording, sub *history.Subscription, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse], first *gatewayv1.SendMessageResponse) error {
	defer sub.Close()
	for {
		entries, err := sub.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				s.detach(rec)
				return status.FromContextError(ctx.Err()).Err()
			}
			return historyError(err, rec.ThreadID())
		}
		if first != nil {
			if err := stream.Send(first); err != nil {
				return fmt.Errorf("streaming to client: %w", err)
			}
			first = nil
		}
		for _, e := range entries {
			if _, err := s.sendEntry(stream, e, true); err != nil {
				if ctx.Err() != nil {
					s.detach(rec)
				}
				return err
			}
		}
	}
}

// sendEntry sends an entry of a request's answer to a SendMessage caller:
// an event as a response, the outcome as the stream's end (the error a
// request that did not end well ended with). It reports the outcome.
func (s *Server) sendEntry(stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse], e *gatewayv1.ThreadEntry, replayed bool) (bool, error) {
	switch x := e.GetEntry().(type) {
	case *gatewayv1.ThreadEntry_Event:
		if err := stream.Send(&gatewayv1.SendMessageResponse{RequestId: e.GetRequestId(), Event: x.Event, ThreadId: e.GetThreadId(), EntryId: e.GetEntryId(), Replayed: replayed}); err != nil {
			return false, fmt.Errorf("streaming to client: %w", err)
		}
		s.metrics.Relayed()
	case *gatewayv1.ThreadEntry_Outcome:
		if code := codes.Code(x.Outcome.GetCode()); code != codes.OK {
			return true, status.Error(code, x.Outcome.GetMessage())
		}
		return true, nil
	}
	return false, nil
}

// replay answers a repeated idempotency key with the answer to the request
// that first carried it, without asking the agent again: live from this
// replica's recording, or from the replica that answers it (which has the
// part not yet written), or from the store once it has ended, or when the
// replica that answered it is gone.
func (s *Server) replay(req *gatewayv1.SendMessageRequest, prev *sent, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	ctx := stream.Context()
	ref, err := history.ParseEntryRef(prev.entry)
	if err != nil || prev.threadID == "" || ref.RequestID() != prev.requestID {
		// Recorded without history: all there is to say is that it was sent.
		s.metrics.Request(metrics.IdempotentRepeat)
		return alreadySent(req.GetIdempotencyKey(), req.GetAgentId(), prev.requestID)
	}
	s.metrics.Request(metrics.Replayed)
	first := &gatewayv1.SendMessageResponse{RequestId: prev.requestID, ThreadId: prev.threadID, EntryId: prev.entry, Replayed: true}
	if rec := s.hist.Live(prev.requestID); rec != nil {
		return s.relayRecording(ctx, rec, rec.Subscribe(1), stream, first)
	}
	from, sentFirst := uint32(1), false
	if owner := requestReplica(prev.requestID); s.cluster != nil && owner != "" && owner != s.serverID && !forwarded(ctx) {
		next, relayed, err := s.forwardReplay(ctx, owner, req, stream)
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return err
		}
		// The replica answering it is gone: what it stored is all there is.
		s.log.InfoContext(ctx, "replaying from the store: the replica that answered the request is unreachable", "request_id", prev.requestID, "error", err)
		from, sentFirst = max(next, 1), relayed
	}
	if sentFirst {
		first = nil
	}
	return s.replayStored(ctx, prev, ref, from, first, stream)
}

// forwardReplay relays the replay of the replica that answered the request
// (its owner). It returns the sequence number after the last entry it
// relayed, and whether it relayed anything.
func (s *Server) forwardReplay(ctx context.Context, owner string, req *gatewayv1.SendMessageRequest, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) (uint32, bool, error) {
	peer, err := s.peerFor(ctx, owner)
	if err != nil {
		return 0, false, err
	}
	up, err := peer.SendMessage(s.peers.outgoing(ctx), req)
	if err != nil {
		return 0, false, err
	}
	var next uint32
	relayed := false
	for {
		m, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return next, relayed, nil
		}
		if err != nil {
			return next, relayed, err
		}
		if err := stream.Send(m); err != nil {
			return next, relayed, fmt.Errorf("streaming to client: %w", err)
		}
		relayed = true
		if seq, _, err := history.Seq(m.GetEntryId()); err == nil {
			next = seq + 1
		}
	}
}

// replayStored sends a request's stored entries from seq from on, after
// first (unless nil), which is sent only if the request's message is
// stored. A request whose outcome is not stored was cut off: its replica
// stopped before the request ended.
func (s *Server) replayStored(ctx context.Context, prev *sent, ref history.EntryRef, from uint32, first *gatewayv1.SendMessageResponse, stream grpc.ServerStreamingServer[gatewayv1.SendMessageResponse]) error {
	read := from
	if first != nil {
		read = 0 // the message: whether it is stored
	}
	for {
		entries, more, err := s.hist.RequestEntries(ctx, prev.threadID, ref, read, defaultEntriesPage)
		if err != nil {
			return historyError(err, prev.threadID)
		}
		for _, e := range entries {
			if first != nil {
				if err := stream.Send(first); err != nil {
					return fmt.Errorf("streaming to client: %w", err)
				}
				first = nil
			}
			seq, _, _ := history.Seq(e.GetEntryId())
			read = seq + 1
			if seq < from {
				continue
			}
			ended, err := s.sendEntry(stream, e, true)
			if ended || err != nil {
				return err
			}
		}
		if !more {
			if first != nil {
				return status.Errorf(codes.Unavailable, "request %s was cut off: the gateway replica answering it stopped before it recorded the message; the message is not sent to the agent again", prev.requestID)
			}
			return status.Errorf(codes.Unavailable, "the answer to request %s is incomplete: the gateway replica answering it stopped before it ended; the message is not sent to the agent again", prev.requestID)
		}
	}
}

// pageSize applies the defaults and bounds of a page size.
func pageSize(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, status.Error(codes.InvalidArgument, "page_size must not be negative")
	case n == 0:
		return defaultEntriesPage, nil
	}
	return min(int(n), maxEntriesPage), nil
}

// authorizeThread is the thread, if the caller may read it; NOT_FOUND
// otherwise, as for a thread that does not exist.
func (s *Server) authorizeThread(ctx context.Context, threadID string) error {
	if s.hist == nil {
		return status.Error(codes.Unimplemented, "this gateway keeps no history")
	}
	if err := checkID(ids.ThreadID, threadID); err != nil {
		return err
	}
	info, err := s.hist.Thread(ctx, threadID)
	if err != nil {
		return historyError(err, threadID)
	}
	if !s.mayRead(ctx, info.Owner) {
		return historyError(history.ErrNotFound, threadID)
	}
	return nil
}

// History implements gatewayv1.GatewayServiceServer: a thread's entries,
// oldest first. The page token is the last entry's id.
func (s *Server) History(ctx context.Context, req *gatewayv1.HistoryRequest) (*gatewayv1.HistoryResponse, error) {
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	after := req.GetAfter()
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) == 0 || len(b) > history.MaxEntryIDBytes {
			return nil, status.Error(codes.InvalidArgument, "page_token is not one this server issued")
		}
		after = string(b)
	}
	if err := s.authorizeThread(ctx, req.GetThreadId()); err != nil {
		return nil, err
	}
	entries, more, err := s.hist.Entries(ctx, req.GetThreadId(), after, size)
	if err != nil {
		return nil, historyError(err, req.GetThreadId())
	}
	resp := &gatewayv1.HistoryResponse{Entries: entries}
	if more && len(entries) > 0 {
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(entries[len(entries)-1].GetEntryId()))
	}
	return resp, nil
}

// ListThreads implements gatewayv1.GatewayServiceServer: an agent's
// threads, newest first; a client sees its own, an admin every one.
func (s *Server) ListThreads(ctx context.Context, req *gatewayv1.ListThreadsRequest) (*gatewayv1.ListThreadsResponse, error) {
	if s.hist == nil {
		return nil, status.Error(codes.Unimplemented, "this gateway keeps no history")
	}
	if err := checkID(ids.AgentID, req.GetAgentId()); err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	client := auth.ClientID(ctx)
	if s.admins[client] {
		client = ""
	}
	threads, next, err := s.hist.Threads(ctx, req.GetAgentId(), client, size, req.GetPageToken())
	if err != nil {
		return nil, historyError(err, "")
	}
	resp := &gatewayv1.ListThreadsResponse{Threads: make([]*gatewayv1.Thread, 0, len(threads)), NextPageToken: next}
	for _, t := range threads {
		resp.Threads = append(resp.Threads, t.Proto(req.GetAgentId()))
	}
	return resp, nil
}
