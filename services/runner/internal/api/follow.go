package api

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/conclave-ai/conclave/pkg/ids"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// followPoll is how often a follower of an instance whose agent runs on
// another replica reads the store for new log chunks (chunks are written
// every 200ms while an agent talks).
const followPoll = 500 * time.Millisecond

// followChunks is how many chunks one read of the store returns.
const followChunks = 100

// FollowAgentLogs sends the tail, then new lines until the instance's
// launch ends or the client goes. On the replica running the agent, lines
// come as they are logged; elsewhere (any replica may be asked), from the
// store, read every followPoll.
func (s *Server) FollowAgentLogs(req *runnerv1.FollowAgentLogsRequest, stream runnerv1.RunnerService_FollowAgentLogsServer) error {
	ctx := stream.Context()
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return err
	}
	n, err := s.tail(req.GetTail())
	if err != nil {
		return err
	}
	id := req.GetInstanceId()
	if _, err := s.rec.Instance(ctx, id); err != nil {
		return fromRecords(err, "instance "+id)
	}
	send := func(l records.LogLine) error {
		return stream.Send(&runnerv1.FollowAgentLogsResponse{Line: logProto(l)})
	}
	if s.sup.Live(id) {
		return s.followLive(ctx, id, n, send)
	}
	lines, newest, err := s.rec.TailLogs(ctx, id, n)
	if err != nil {
		return internal(err)
	}
	for _, l := range lines {
		if err := send(l); err != nil {
			return err
		}
	}
	return s.followStored(ctx, id, newest, time.Time{}, send)
}

// followLive follows the lines this replica's agent logs. If the agent
// stops here while the instance's launch goes on elsewhere (a new launch
// claimed by another replica), it goes on from the store.
func (s *Server) followLive(ctx context.Context, id string, n int, send func(records.LogLine) error) error {
	// Subscribe before reading the tail, so no line falls between them: a
	// line is stored before the read, or among those unstored when
	// subscribing, or sent live after. A line in two of them is sent once,
	// by time (an instance's lines have distinct, increasing times).
	live, unstored, stop := s.sup.Logs().Follow(id)
	defer stop()
	lines, newest, err := s.rec.TailLogs(ctx, id, n)
	if err != nil {
		return internal(err)
	}
	var last time.Time
	for _, l := range append(lines, unstored...) {
		if !l.Time.After(last) {
			continue
		}
		if err := send(l); err != nil {
			return err
		}
		last = l.Time
	}
	// drain sends what is buffered; ok is false once the follower was cut
	// off.
	drain := func() (ok bool, err error) {
		for {
			select {
			case l, ok := <-live:
				if !ok {
					return false, nil
				}
				if l.Time.After(last) {
					if err := send(l); err != nil {
						return true, err
					}
					last = l.Time
				}
			default:
				return true, nil
			}
		}
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-live:
			if !ok {
				return apiError(codes.ResourceExhausted, CodeBadRequest, "the log follower fell too far behind", "reconnect to continue from the tail")
			}
			if !l.Time.After(last) {
				continue
			}
			if err := send(l); err != nil {
				return err
			}
			last = l.Time
		case <-tick.C:
			if s.sup.Live(id) {
				continue
			}
			in, err := s.rec.Instance(ctx, id)
			if err != nil || in.Deleted || !in.Launching() {
				// The launch has ended: drain what is buffered, then stop.
				_, err := drain()
				return err
			}
			// The agent stopped here, and a new launch is queued or runs
			// on another replica. Every line the agent here logged is
			// stored: the store has the rest.
			if ok, err := drain(); err != nil || !ok {
				return err
			}
			return s.followStored(ctx, id, newest, last, send)
		case <-ctx.Done():
			return nil
		}
	}
}

// followStored sends the instance's stored lines in chunks numbered above
// cursor, every followPoll, until its launch has ended and every line it
// stored is sent. Lines up to sent (the time of the last line a live
// follower sent, or zero) are skipped until the first later one: the
// chunks begin with what was already sent live, in order.
func (s *Server) followStored(ctx context.Context, id string, cursor int64, sent time.Time, send func(records.LogLine) error) error {
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	// ended: the previous poll found the launch ended. Its last lines are
	// stored just after its end is, so one more poll finds them.
	ended := false
	for {
		found := 0
		for {
			chunks, err := s.rec.LogsAfter(ctx, id, cursor, followChunks)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return internal(err)
			}
			for _, c := range chunks {
				for _, l := range c.Lines {
					if !sent.IsZero() {
						if !l.Time.After(sent) {
							continue
						}
						sent = time.Time{}
					}
					if err := send(l); err != nil {
						return err
					}
				}
				cursor = c.Seq
			}
			found += len(chunks)
			if len(chunks) < followChunks {
				break
			}
		}
		if ended && found == 0 {
			return nil
		}
		in, err := s.rec.Instance(ctx, id)
		switch {
		case errors.Is(err, records.ErrNotFound) || err == nil && in.Deleted:
			return nil
		case err != nil:
			if ctx.Err() != nil {
				return nil
			}
			return internal(err)
		}
		ended = !in.Launching()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
	}
}
