package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/queue"
)

// MaxPriority is the highest launch priority; priorities run from 0 (the
// default) to it.
const MaxPriority = 3

// LaneQueue names the launch queue of priority p: the launch queue itself
// for 0, launchQueue-p<p> above.
func LaneQueue(launchQueue string, p int) string {
	if p <= 0 {
		return launchQueue
	}
	return launchQueue + "-p" + strconv.Itoa(p)
}

// doorbell is the message a launch of priority above 0 leaves on the
// priority 0 queue, which idle workers long-poll: it wakes one to look at
// the higher queues.
var doorbell = []byte(`{"doorbell":true}`)

func isDoorbell(body []byte) bool {
	var m struct {
		Doorbell bool `json:"doorbell"`
	}
	return json.Unmarshal(body, &m) == nil && m.Doorbell
}

// lanes is the launch queues of every priority seen as one queue, named
// after the priority 0 one, for queue.Consume: a Receive takes from the
// highest priority queue that has a message, and long-polls the priority 0
// queue only when none has. Consume's workers receive only when they are
// free, so whenever workers are busy and launches wait, the next free
// worker starts the waiting launch of highest priority. Receipt handles are
// tagged with their queue, so that Delete and ChangeVisibility reach it.
// Any other queue name passes through.
type lanes struct {
	queue.Queue
	name string
	log  *slog.Logger
}

func newLanes(q queue.Queue, launchQueue string, log *slog.Logger) *lanes {
	return &lanes{Queue: q, name: launchQueue, log: log}
}

// tag and untag put a message's priority in front of its receipt handle.
func tag(p int, receipt string) string { return strconv.Itoa(p) + ":" + receipt }

func (l *lanes) untag(receipt string) (string, string) {
	p, rest, ok := strings.Cut(receipt, ":")
	n, err := strconv.Atoi(p)
	if !ok || err != nil || n < 0 || n > MaxPriority {
		return l.name, receipt
	}
	return LaneQueue(l.name, n), rest
}

func (l *lanes) Receive(ctx context.Context, name string, opts queue.ReceiveOptions) ([]queue.Message, error) {
	if name != l.name {
		return l.Queue.Receive(ctx, name, opts)
	}
	for {
		for p := MaxPriority; p >= 1; p-- {
			msgs, err := l.Queue.Receive(ctx, LaneQueue(l.name, p), queue.ReceiveOptions{Max: opts.Max, Visibility: opts.Visibility})
			if err != nil {
				return nil, err
			}
			if len(msgs) > 0 {
				return tagAll(p, msgs), nil
			}
		}
		msgs, err := l.Queue.Receive(ctx, l.name, opts)
		if err != nil || len(msgs) == 0 {
			return nil, err
		}
		launches := msgs[:0]
		rang := false
		for _, m := range msgs {
			if isDoorbell(m.Body) {
				rang = true
				if err := l.Queue.Delete(context.WithoutCancel(ctx), l.name, m.ReceiptHandle); err != nil {
					l.log.DebugContext(ctx, "runner: deleting a doorbell", "error", err)
				}
				continue
			}
			launches = append(launches, m)
		}
		if len(launches) > 0 || !rang || ctx.Err() != nil {
			return tagAll(0, launches), nil
		}
		// Only doorbells: a launch of higher priority was queued.
	}
}

func tagAll(p int, msgs []queue.Message) []queue.Message {
	for i := range msgs {
		msgs[i].ReceiptHandle = tag(p, msgs[i].ReceiptHandle)
	}
	return msgs
}

func (l *lanes) Delete(ctx context.Context, name, receipt string) error {
	if name != l.name {
		return l.Queue.Delete(ctx, name, receipt)
	}
	lane, r := l.untag(receipt)
	return l.Queue.Delete(ctx, lane, r)
}

func (l *lanes) ChangeVisibility(ctx context.Context, name, receipt string, d time.Duration) error {
	if name != l.name {
		return l.Queue.ChangeVisibility(ctx, name, receipt, d)
	}
	lane, r := l.untag(receipt)
	return l.Queue.ChangeVisibility(ctx, lane, r, d)
}

// Enqueue queues launch seq of an instance at its priority (clamped to 0
// to MaxPriority; the API refuses others). A launch above priority 0 rings
// the doorbell on the priority 0 queue for idle workers; a doorbell that
// cannot be sent costs only latency (idle workers look at every queue at
// least every long poll, 20s).
func (s *Supervisor) Enqueue(ctx context.Context, instanceID string, seq, priority int) error {
	priority = min(max(priority, 0), MaxPriority)
	body, _ := json.Marshal(launchMessage{InstanceID: instanceID, Seq: seq})
	if _, err := s.o.Queue.Send(ctx, LaneQueue(s.o.LaunchQueue, priority), queue.Outgoing{Body: body}); err != nil {
		return fmt.Errorf("queueing the launch: %w", err)
	}
	if priority > 0 {
		if _, err := s.o.Queue.Send(ctx, s.o.LaunchQueue, queue.Outgoing{Body: doorbell}); err != nil {
			s.log.WarnContext(ctx, "runner: ringing the launch doorbell", "instance_id", instanceID, "error", err)
		}
	}
	return nil
}
