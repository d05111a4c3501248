package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Handler processes one message. Returning nil deletes the message; an
// error (or a panic) leaves it to be delivered again, so a handler must be
// idempotent. Its ctx is not cancelled when Consume is asked to stop, so
// that the message in hand can be finished.
type Handler func(ctx context.Context, m Message) error

// ConsumerOptions tunes Consume.
type ConsumerOptions struct {
	// Workers is how many messages are handled at once; 0 means 1.
	Workers int
	// Visibility is how long a message stays hidden while its handler runs;
	// Consume extends it every Visibility/2 for as long as the handler
	// takes. 0 means 30s.
	Visibility time.Duration
	// MaxBatch is how many messages a worker receives at once, 1 to 10; 0
	// means 1. Larger batches mean fewer requests but hold messages that
	// another worker could have taken.
	MaxBatch int
	// Backoff, when set, gives the visibility of a message whose handler
	// failed, from its receive count, so retries can slow down. When nil the
	// message comes back once its current visibility ends.
	Backoff func(receiveCount int) time.Duration
	// Logger receives handler failures and receive errors; nil means
	// slog.Default().
	Logger *slog.Logger
	// TracerProvider makes the consumer spans; nil means the global one.
	TracerProvider trace.TracerProvider
}

const tracerName = "github.com/conclave-ai/conclave/pkg/queue"

// Consume receives from queue with opts.Workers workers and hands each
// message to handler in a span that is a child of the producer's, until ctx
// is cancelled. Then it stops receiving, releases messages received but not
// started, waits for the handlers in progress, and returns nil.
//
// Errors receiving are logged and retried with backoff, as they are mostly
// transient; a queue that does not exist or invalid options end Consume
// with an error.
func Consume(ctx context.Context, q Queue, queue string, handler Handler, opts ConsumerOptions) error {
	c, err := newConsumer(q, queue, handler, opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		fatal error
	)
	for range c.workers {
		wg.Go(func() {
			if err := c.work(ctx); err != nil {
				once.Do(func() { fatal = err })
				cancel()
			}
		})
	}
	wg.Wait()
	return fatal
}

type consumer struct {
	q          Queue
	queue      string
	handler    Handler
	workers    int
	batch      int
	visibility time.Duration
	backoff    func(int) time.Duration
	log        *slog.Logger
	tracer     trace.Tracer
}

func newConsumer(q Queue, queue string, handler Handler, o ConsumerOptions) (*consumer, error) {
	c := &consumer{q: q, queue: queue, handler: handler, workers: o.Workers, batch: o.MaxBatch,
		visibility: ceilSeconds(o.Visibility), backoff: o.Backoff, log: o.Logger}
	if c.workers == 0 {
		c.workers = 1
	}
	if c.batch == 0 {
		c.batch = 1
	}
	if c.visibility == 0 {
		c.visibility = defaultVisibility
	}
	switch {
	case c.workers < 0:
		return nil, fmt.Errorf("queue: consume %q: %w: %d workers", queue, ErrInvalid, o.Workers)
	case c.batch < 0 || c.batch > MaxBatch:
		return nil, fmt.Errorf("queue: consume %q: %w: batch of %d is outside [1, %d]", queue, ErrInvalid, o.MaxBatch, MaxBatch)
	case c.visibility < time.Second || c.visibility > MaxVisibility:
		// Under a second there would be no time to extend it.
		return nil, fmt.Errorf("queue: consume %q: %w: visibility %v is outside [1s, %v]", queue, ErrInvalid, o.Visibility, MaxVisibility)
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("queue", queue)
	tp := o.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	c.tracer = tp.Tracer(tracerName)
	return c, nil
}

// Receive errors are retried after a delay that doubles up to a ceiling,
// so an outage neither spins nor stalls recovery for long.
const (
	minRetry = 100 * time.Millisecond
	maxRetry = 5 * time.Second
)

// work is one worker's loop. It returns nil when ctx ends, or an error
// that retrying cannot fix.
func (c *consumer) work(ctx context.Context) error {
	retry := minRetry
	for ctx.Err() == nil {
		msgs, err := c.q.Receive(ctx, c.queue, ReceiveOptions{Max: c.batch, Wait: MaxWait, Visibility: c.visibility})
		switch {
		case ctx.Err() != nil:
			// Messages received as the stop came stay hidden until their
			// visibility ends; release them for other consumers.
			c.release(ctx, msgs)
			return nil
		case errors.Is(err, ErrQueueNotFound) || errors.Is(err, ErrInvalid):
			return err
		case err != nil:
			c.log.WarnContext(ctx, "queue: receive failed, retrying", "error", err, "retry_in", retry)
			select {
			case <-time.After(retry):
			case <-ctx.Done():
			}
			retry = min(2*retry, maxRetry)
			continue
		}
		retry = minRetry
		c.handleBatch(ctx, msgs)
	}
	return nil
}

// handleBatch runs the handler on each message in turn, keeping the
// messages not yet finished hidden, and releases those not started when ctx
// ends.
func (c *consumer) handleBatch(ctx context.Context, msgs []Message) {
	if len(msgs) == 0 {
		return
	}
	// Handling and acknowledging outlive a stop request, so the message in
	// hand is finished and not handled twice.
	live := context.WithoutCancel(ctx)
	hb := c.heartbeat(live, msgs)
	defer hb.stop()
	for i, m := range msgs {
		if ctx.Err() != nil {
			for _, rest := range msgs[i:] {
				hb.done(rest.ReceiptHandle)
			}
			c.release(live, msgs[i:])
			return
		}
		c.handle(live, m, hb)
	}
}

func (c *consumer) handle(ctx context.Context, m Message, hb *heartbeat) {
	ctx, span := c.tracer.Start(m.TraceContext(ctx), c.queue+" process",
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "aws_sqs"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", c.queue),
			attribute.String("messaging.message.id", m.ID),
			attribute.Int("messaging.aws_sqs.receive_count", m.ReceiveCount),
		))
	defer span.End()
	err := c.call(ctx, m)
	// Stop extending before acknowledging, so an extension cannot land
	// after the delete or undo the backoff.
	hb.done(m.ReceiptHandle)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		c.log.WarnContext(ctx, "queue: handler failed, message will be redelivered",
			"message_id", m.ID, "receive_count", m.ReceiveCount, "error", err)
		var after *retryAfterError
		switch {
		case errors.As(err, &after):
			c.setVisibility(ctx, m, after.after)
		case c.backoff != nil:
			c.setVisibility(ctx, m, c.backoff(m.ReceiveCount))
		}
		return
	}
	if err := c.q.Delete(ctx, c.queue, m.ReceiptHandle); err != nil {
		span.RecordError(err)
		c.log.WarnContext(ctx, "queue: delete failed, message will be redelivered", "message_id", m.ID, "error", err)
	}
}

// call runs the handler, turning a panic into an error so one bad message
// cannot take the service down.
func (c *consumer) call(ctx context.Context, m Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("queue: handler panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return c.handler(ctx, m)
}

// release makes messages that will not be handled visible again at once.
func (c *consumer) release(ctx context.Context, msgs []Message) {
	ctx = context.WithoutCancel(ctx)
	for _, m := range msgs {
		if err := c.q.ChangeVisibility(ctx, c.queue, m.ReceiptHandle, 0); err != nil {
			c.log.DebugContext(ctx, "queue: release failed, message returns when its visibility ends", "message_id", m.ID, "error", err)
		}
	}
}

// setVisibility has a failed message delivered again after d.
func (c *consumer) setVisibility(ctx context.Context, m Message, d time.Duration) {
	if err := c.q.ChangeVisibility(ctx, c.queue, m.ReceiptHandle, d); err != nil {
		c.log.WarnContext(ctx, "queue: backoff failed", "message_id", m.ID, "error", err)
	}
}

// RetryAfter wraps a handler's error so that its message is delivered again
// after d (in whole seconds, as SQS counts them; 0 at once), rather than
// when the consumer's Backoff says or, without one, when its visibility
// ends: for a failure the handler knows to be brief, such as a record
// another replica is about to write.
func RetryAfter(err error, d time.Duration) error {
	return &retryAfterError{err: err, after: min(max(d, 0), MaxVisibility)}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// heartbeat extends the visibility of a batch's unfinished messages every
// half visibility, so a slow handler does not see its message delivered to
// another consumer.
type heartbeat struct {
	// mu is held while extending, so done waits out an extension in
	// progress and none happens after it.
	mu      sync.Mutex
	pending map[string]Message
	quit    chan struct{}
	exited  chan struct{}
}

func (c *consumer) heartbeat(ctx context.Context, msgs []Message) *heartbeat {
	hb := &heartbeat{pending: make(map[string]Message, len(msgs)), quit: make(chan struct{}), exited: make(chan struct{})}
	for _, m := range msgs {
		hb.pending[m.ReceiptHandle] = m
	}
	go func() {
		defer close(hb.exited)
		t := time.NewTicker(c.visibility / 2)
		defer t.Stop()
		for {
			select {
			case <-hb.quit:
				return
			case <-t.C:
			}
			hb.mu.Lock()
			for h, m := range hb.pending {
				err := c.q.ChangeVisibility(ctx, c.queue, h, c.visibility)
				if err == nil {
					continue
				}
				c.log.WarnContext(ctx, "queue: extending visibility failed, message may be delivered twice", "message_id", m.ID, "error", err)
				if errors.Is(err, ErrInvalidReceipt) {
					// The handle left flight (its visibility ran out before
					// an extension landed): no later extension can succeed,
					// and asking again only adds load to a loaded queue.
					delete(hb.pending, h)
				}
			}
			hb.mu.Unlock()
		}
	}()
	return hb
}

// done stops extending the message with this receipt handle.
func (hb *heartbeat) done(receiptHandle string) {
	hb.mu.Lock()
	delete(hb.pending, receiptHandle)
	hb.mu.Unlock()
}

func (hb *heartbeat) stop() {
	close(hb.quit)
	<-hb.exited
}
