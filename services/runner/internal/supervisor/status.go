package supervisor

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// update applies fn to the stored instance, fenced by the session's claim,
// records the result and announces a change of status.
func (ss *session) update(ctx context.Context, fn func(in *records.Instance) error) (*records.Instance, error) {
	ss.stMu.Lock()
	in, ev, err := ss.write(ctx, fn, nil)
	if err == nil {
		ss.in = in
	}
	ss.stMu.Unlock()
	if err != nil {
		return nil, err
	}
	ss.announce(ctx, in, ev)
	return in, nil
}

// probe applies fn to a copy of the instance as last written, and reports
// whether it changes nothing: such a change costs no write, each being a
// durable commit. Call with stMu held.
func (ss *session) probe(fn func(in *records.Instance)) (*records.Instance, bool) {
	probe := *ss.in
	fn(&probe)
	return &probe, reflect.DeepEqual(&probe, ss.in)
}

// setStatus records a status change and sends its event, once the change
// is written. A failed write is logged.
func (ss *session) setStatus(ctx context.Context, fn func(in *records.Instance)) {
	ss.stMu.Lock()
	probe, unchanged := ss.probe(fn)
	if unchanged {
		ss.stMu.Unlock()
		return
	}
	if probe.Terminal() && ss.log != nil {
		// A client that sees the turn end reads all of its lines.
		ss.log.Sync(ctx)
	}
	in, ev, err := ss.write(ctx, func(in *records.Instance) error { fn(in); return nil }, nil)
	if err == nil {
		ss.in = in
	}
	ss.stMu.Unlock()
	if err == nil {
		ss.announce(ctx, in, ev)
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
	probe, unchanged := ss.probe(fn)
	if unchanged {
		ss.stMu.Unlock()
		return
	}
	var planned *records.OutboxEvent
	if probe.Status != ss.in.Status {
		ev := ss.s.events.prepare(ctx, EventStatusChanged, probe.TaskID, probe.ID, statusPayload(probe))
		planned = &ev
	}
	ss.statusWrites.Add(1)
	go func() {
		defer ss.statusWrites.Done()
		defer ss.stMu.Unlock()
		if in, _, err := ss.write(ctx, func(in *records.Instance) error { fn(in); return nil }, planned); err == nil {
			ss.in = in
		}
	}()
	ss.announce(ctx, probe, planned)
}

// write applies fn to the stored instance if the session still holds its
// claim, with the event of the status change it makes, if any, in the
// outbox (planned: that event, announced already). A lost claim, or a
// deleted instance, kills the session quietly. Call with stMu held.
func (ss *session) write(ctx context.Context, fn func(in *records.Instance) error, planned *records.OutboxEvent) (*records.Instance, *records.OutboxEvent, error) {
	var ev *records.OutboxEvent
	in, err := ss.s.o.Records.UpdateInstance(ctx, ss.launch.ID, ss.s.withStatusEvent(ctx, func(in *records.Instance) error {
		if in.ClaimMsg != ss.claimMsg || in.ClaimRecv != ss.claimRecv || in.ClaimSeq != ss.seq {
			return errClaimLost
		}
		return fn(in)
	}, planned, &ev))
	switch {
	case errors.Is(err, errClaimLost):
		ss.kill(stopSuperseded, "superseded: "+errClaimLost.Error())
	case errors.Is(err, records.ErrNotFound):
		ss.kill(stopDeleted, "deleted")
	case err != nil && !errors.Is(err, ErrBusy) && !errors.Is(err, ErrFinished):
		ss.s.log.WarnContext(ctx, "runner: recording an instance's status", "instance_id", ss.launch.ID, "error", err)
	}
	return in, ev, err
}

// announce logs and publishes a change of status to in's, whose event is
// ev (nil: the status did not change).
func (ss *session) announce(ctx context.Context, in *records.Instance, ev *records.OutboxEvent) {
	if ev == nil {
		return
	}
	ss.log.Add(StreamRunner, "status: "+in.Status+errorSuffix(in.Error))
	ss.s.announce(ctx, ev, in.Status)
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
		in.TurnDone, in.Prompt = in.Turn, ""
	})
	return nil
}
