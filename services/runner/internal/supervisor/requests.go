package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

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
		in.Status, in.FinishedAt, in.Error, in.Approval = records.StatusStopped, time.Now().UTC(), "cancelled: "+reason, nil
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
