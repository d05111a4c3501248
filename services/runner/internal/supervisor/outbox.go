package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

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

// errEventsPending leaves a launch on the queue while the events of its
// status changes cannot be sent: its next delivery drains the outbox again.
var errEventsPending = errors.New("the launch's events are not on the events queue yet; the launch will be retried")

// eventsPatience is how long a worker waits for a launch's events to be
// sent before it leaves the launch for a later delivery, well within the
// launch message's visibility so that no other runner takes it meanwhile.
func (s *Supervisor) eventsPatience() time.Duration {
	return max(s.o.Visibility/2, time.Second)
}

func statusPayload(in *records.Instance) map[string]any {
	p := map[string]any{"instance_id": in.ID, "task_id": in.TaskID, "agent_type": in.AgentType, "status": in.Status, "progress": float64(in.Progress)}
	if in.Error != "" {
		p["error"] = in.Error
	}
	if a := in.Approval; a != nil && in.Status == records.StatusAwaitingApproval {
		p["review_url"], p["approval_request_id"], p["approval_deadline"] = a.ReviewURL, a.RequestID, a.Deadline.Format(time.RFC3339)
	}
	return p
}
