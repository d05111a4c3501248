// Package queue is the port through which Conclave services exchange
// cross-service events, shaped after Amazon SQS so that production can run on
// SQS itself while `conclave dev` and single-node installs run on one local
// file with the same behaviour.
//
// SQS semantics are the contract, whichever backend is behind the port:
// delivery is at-least-once, a received message stays invisible for its
// visibility timeout and then comes back unless deleted, messages may be
// delayed, and a queue with MaxReceiveCount moves a message that keeps coming
// back to its dead-letter queue. Consumers must therefore be idempotent.
//
// Trace context travels with every message in a traceparent attribute, so a
// consumer's span joins the producer's trace (see Message.TraceContext and
// Consume).
//
// Limits that SQS would enforce (size, attribute count, names, ranges) are
// checked before any request, by both backends alike, so a message that works
// in development does not start failing on AWS.
package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Queue is the port. Every method takes the queue's name, not its URL, so
// callers never handle backend-specific addresses.
type Queue interface {
	// Ensure creates the queue, and its dead-letter queue when
	// def.MaxReceiveCount > 0, or updates them to match def. It is
	// idempotent; services call it at start-up.
	Ensure(ctx context.Context, def Definition) error
	// Send enqueues msgs and returns their message IDs in order. The trace
	// context of ctx is added to each message. Messages are validated before
	// anything is sent; a failure after that is a *SendError naming the
	// messages that were not sent.
	Send(ctx context.Context, queue string, msgs ...Outgoing) ([]string, error)
	// Receive returns up to opts.Max messages, waiting up to opts.Wait for
	// the first one. It returns no messages and no error when none arrived.
	Receive(ctx context.Context, queue string, opts ReceiveOptions) ([]Message, error)
	// Delete acknowledges a received message: deleted while in flight under
	// receiptHandle, it is never delivered again. Deleting with a receipt
	// handle that is no longer current (the message was deleted, received
	// again, or, on SQS, its visibility ran out) is not an error and
	// deletes nothing, as in SQS: the message is back in the queue or the
	// later receiver owns it now.
	Delete(ctx context.Context, queue, receiptHandle string) error
	// ChangeVisibility makes an in-flight message invisible for d from now
	// (0 makes it visible at once). It fails with ErrInvalidReceipt when the
	// message is no longer in flight under that handle.
	ChangeVisibility(ctx context.Context, queue, receiptHandle string, d time.Duration) error
	// Redrive moves the messages available in the dead-letter queue dlq back
	// to source and returns how many it moved. Moved messages are new
	// messages: new IDs, receive count 0, original body and attributes
	// (including the producer's trace context).
	Redrive(ctx context.Context, dlq, source string) (moved int, err error)
}

// Definition declares one queue. Each service keeps one Definition per queue
// it owns, and that value is what creates the queue locally, in tests, and
// (through infra/) on AWS. Durations are rounded up to whole seconds, the
// granularity of SQS.
type Definition struct {
	// Name is 1 to 80 characters: letters, digits, '-' and '_'.
	Name string
	// VisibilityTimeout is how long a received message stays hidden before
	// it is delivered again; 0 means 30s (the SQS default), at most 12h.
	VisibilityTimeout time.Duration
	// MaxReceiveCount > 0 moves a message to DeadLetterQueue when it would be
	// received for the (MaxReceiveCount+1)th time. 0 means no dead-letter
	// queue. At most 1000.
	MaxReceiveCount int
	// DeadLetterQueue names the dead-letter queue; "" means Name+"-dlq".
	// Ensure creates it with the longest retention, 14 days, so dead letters
	// outlive the messages of the source queue. Only valid with
	// MaxReceiveCount > 0.
	DeadLetterQueue string
	// Delay is the default delay of messages sent without their own; at
	// most 15m.
	Delay time.Duration
	// Retention is how long a message is kept if nobody deletes it; 0 means
	// 4 days (the SQS default), otherwise 1m to 14 days.
	Retention time.Duration
}

// Outgoing is a message to send.
type Outgoing struct {
	// Body is 1 byte or more of UTF-8 text in the characters SQS accepts
	// (XML 1.0 characters). Events are protobuf envelopes encoded as JSON
	// or base64 by their owners.
	Body []byte
	// Attributes are String message attributes. Send adds traceparent and
	// tracestate, and the total may not exceed MaxAttributes.
	Attributes map[string]string
	// Delay hides the message for this long after sending; 0 means the
	// queue's default delay. At most 15m.
	Delay time.Duration
}

// ReceiveOptions tunes Receive.
type ReceiveOptions struct {
	// Max is how many messages to return at most, 1 to 10; 0 means 1.
	Max int
	// Wait is how long to wait for a message when none is available (long
	// polling), at most 20s; 0 returns at once.
	Wait time.Duration
	// Visibility overrides the queue's visibility timeout for these
	// messages; 0 means the queue's. At most 12h.
	Visibility time.Duration
}

// Message is a received message.
type Message struct {
	ID   string
	Body []byte
	// Attributes are the message's String attributes, including traceparent
	// and tracestate when the producer had a trace.
	Attributes map[string]string
	// ReceiptHandle identifies this receipt for Delete and ChangeVisibility.
	ReceiptHandle string
	// ReceiveCount is how many times the message has been received,
	// including this time.
	ReceiveCount int
	// SentAt is when the message was sent (to this queue, for redriven
	// messages).
	SentAt time.Time
}

// Limits enforced before any request, by both backends. They are SQS's.
const (
	// MaxMessageSize is the largest body plus attributes (name, type and
	// value bytes), as SQS counts it.
	MaxMessageSize = 256 << 10
	// MaxAttributes is the most attributes a message may carry, trace
	// attributes included.
	MaxAttributes = 10
	// MaxBatch is the most messages one Receive returns.
	MaxBatch = 10
	// MaxWait is the longest long poll.
	MaxWait = 20 * time.Second
	// MaxDelay is the longest message delay.
	MaxDelay = 15 * time.Minute
	// MaxVisibility is the longest visibility timeout.
	MaxVisibility = 12 * time.Hour
)

var (
	// ErrQueueNotFound is returned for a queue that does not exist; the
	// error names the queue and the backend's endpoint.
	ErrQueueNotFound = errors.New("queue not found")
	// ErrMessageTooLarge is returned by Send, before anything is sent, for a
	// message over MaxMessageSize.
	ErrMessageTooLarge = errors.New("message too large")
	// ErrTooManyAttributes is returned by Send, before anything is sent, for
	// a message with more than MaxAttributes attributes once the trace
	// attributes are added.
	ErrTooManyAttributes = errors.New("too many message attributes")
	// ErrInvalid is returned, before any request, for an argument SQS would
	// reject: a bad queue name, an out-of-range duration or count, an empty
	// body or one with characters SQS does not accept.
	ErrInvalid = errors.New("invalid argument")
	// ErrInvalidReceipt is returned for a malformed receipt handle, and by
	// ChangeVisibility for one whose message is no longer in flight.
	ErrInvalidReceipt = errors.New("receipt handle invalid or no longer in flight")
)

// SendError reports the messages of one Send call that were not enqueued,
// so that nothing is lost silently and the caller can retry exactly those.
// The messages not listed were sent.
type SendError struct {
	Queue string
	// Failed lists the messages not sent, by ascending Index.
	Failed []FailedEntry
	// Err is the request error that stopped sending, if any; nil when the
	// backend refused individual entries only.
	Err error
}

// FailedEntry is one message that Send did not enqueue.
type FailedEntry struct {
	// Index is the message's position in the Send call.
	Index int
	// Code and Message are the backend's reason.
	Code    string
	Message string
}

func (e *SendError) Error() string {
	const shown = 5
	var b strings.Builder
	fmt.Fprintf(&b, "queue: send to %q: %d message(s) not sent:", e.Queue, len(e.Failed))
	for i, f := range e.Failed {
		if i == shown {
			fmt.Fprintf(&b, " and %d more", len(e.Failed)-shown)
			break
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, " #%d (%s: %s)", f.Index, f.Code, f.Message)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *SendError) Unwrap() error { return e.Err }

// EnsureAll creates each of defs that does not exist yet in q: how a
// service's queues (its Queues) are made before it runs.
func EnsureAll(ctx context.Context, q Queue, defs ...Definition) error {
	for _, d := range defs {
		if err := q.Ensure(ctx, d); err != nil {
			return fmt.Errorf("queue %s: %w", d.Name, err)
		}
	}
	return nil
}
