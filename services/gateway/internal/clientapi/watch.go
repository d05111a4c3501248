package clientapi

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/ids"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/internal/history"
)

// WatchThread implements gatewayv1.GatewayServiceServer: the entries of a
// thread after a point, those stored and then, for each request still
// being answered, the rest as it comes, from the replica answering it.
// Requests are followed one after another, in the thread's order. The
// stream ends when no request of the thread is being answered.
func (s *Server) WatchThread(req *gatewayv1.WatchThreadRequest, stream grpc.ServerStreamingServer[gatewayv1.WatchThreadResponse]) error {
	ctx := stream.Context()
	threadID, after := req.GetThreadId(), req.GetAfter()
	if err := s.authorizeThread(ctx, threadID); err != nil {
		return err
	}
	w := &watch{s: s, stream: stream, threadID: threadID,
		next: map[string]uint32{}, refs: map[string]history.EntryRef{}, ended: map[string]bool{}, followed: map[string]bool{}}
	if after != "" {
		// The request of the last entry the client saw goes on after it.
		seq, requestID, err := history.Seq(after)
		if err != nil {
			return historyError(err, threadID)
		}
		ref, _ := history.ParseEntryRef(after)
		w.note(requestID, ref, seq)
	}
	if id := req.GetRequestId(); id != "" {
		if err := checkID(ids.RequestID, id); err != nil {
			return err
		}
		ref, ok := w.refs[id]
		if !ok {
			return status.Error(codes.InvalidArgument, "with request_id, after must be an entry_id of that request")
		}
		return w.follow(ctx, id, ref)
	}
	cursor := after
	for {
		var err error
		if cursor, err = w.stored(ctx, cursor); err != nil {
			return err
		}
		followed := false
		for _, id := range w.order {
			if w.ended[id] || w.followed[id] {
				continue
			}
			followed = true
			if err := w.follow(ctx, id, w.refs[id]); err != nil {
				return err
			}
		}
		if !followed {
			return nil
		}
	}
}

// watch is one WatchThread's progress: per request, the sequence number
// of the next entry to send, and whether it ended or was followed.
type watch struct {
	s        *Server
	stream   grpc.ServerStreamingServer[gatewayv1.WatchThreadResponse]
	threadID string
	order    []string // requests in the order they were met
	next     map[string]uint32
	refs     map[string]history.EntryRef
	ended    map[string]bool
	followed map[string]bool
}

func (w *watch) note(requestID string, ref history.EntryRef, seq uint32) {
	if _, ok := w.refs[requestID]; !ok {
		w.order = append(w.order, requestID)
		w.refs[requestID] = ref
	}
	w.next[requestID] = max(w.next[requestID], seq+1)
}

// send sends e unless it was sent already, and notes its request's
// progress.
func (w *watch) send(e *gatewayv1.ThreadEntry) error {
	seq, requestID, err := history.Seq(e.GetEntryId())
	if err != nil {
		return historyError(err, w.threadID)
	}
	if n, ok := w.next[requestID]; ok && seq < n {
		return nil
	}
	ref, _ := history.ParseEntryRef(e.GetEntryId())
	w.note(requestID, ref, seq)
	if e.GetOutcome() != nil {
		w.ended[requestID] = true
	}
	if err := w.stream.Send(&gatewayv1.WatchThreadResponse{Entry: e}); err != nil {
		return fmt.Errorf("streaming to client: %w", err)
	}
	return nil
}

// stored sends the thread's stored entries after cursor and returns the
// last one's id.
func (w *watch) stored(ctx context.Context, cursor string) (string, error) {
	for {
		entries, more, err := w.s.hist.Entries(ctx, w.threadID, cursor, defaultEntriesPage)
		if err != nil {
			return cursor, historyError(err, w.threadID)
		}
		for _, e := range entries {
			if err := w.send(e); err != nil {
				return cursor, err
			}
			cursor = e.GetEntryId()
		}
		if !more {
			return cursor, nil
		}
	}
}

// follow sends one request's entries after those sent, until it ends:
// from this replica's recording, or from the replica answering it, or
// from the store when that one is gone.
func (w *watch) follow(ctx context.Context, id string, ref history.EntryRef) error {
	w.followed[id] = true
	if rec := w.s.hist.Live(id); rec != nil {
		sub := rec.Subscribe(w.next[id])
		defer sub.Close()
		for {
			entries, err := sub.Next(ctx)
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				if ctx.Err() != nil {
					w.s.detach(rec)
					return status.FromContextError(ctx.Err()).Err()
				}
				return historyError(err, w.threadID)
			}
			for _, e := range entries {
				if err := w.send(e); err != nil {
					return err
				}
			}
		}
	}
	s := w.s
	if owner := requestReplica(id); s.cluster != nil && owner != "" && owner != s.serverID && !forwarded(ctx) {
		err := w.forward(ctx, owner, id)
		if err == nil || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return err
		}
		s.log.InfoContext(ctx, "watching from the store: the replica answering the request is unreachable", "request_id", id, "error", err)
	}
	for {
		entries, more, err := s.hist.RequestEntries(ctx, w.threadID, ref, w.next[id], defaultEntriesPage)
		if err != nil {
			return historyError(err, w.threadID)
		}
		for _, e := range entries {
			if err := w.send(e); err != nil {
				return err
			}
		}
		if !more {
			return nil
		}
	}
}

// forward follows a request at the replica answering it.
func (w *watch) forward(ctx context.Context, owner, id string) error {
	peer, err := w.s.peerFor(ctx, owner)
	if err != nil {
		return err
	}
	after := ""
	if n := w.next[id]; n > 0 {
		after = history.EntryID(w.refs[id], n-1)
	}
	up, err := peer.WatchThread(w.s.peers.outgoing(ctx), &gatewayv1.WatchThreadRequest{ThreadId: w.threadID, After: after, RequestId: id})
	if err != nil {
		return err
	}
	for {
		m, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := w.send(m.GetEntry()); err != nil {
			return err
		}
	}
}
