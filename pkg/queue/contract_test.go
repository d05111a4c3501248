package queue_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// backend opens a fresh instance of one Queue implementation and tells the
// endpoint its errors must name.
type backend func(t *testing.T) (q queue.Queue, endpoint string)

func embeddedBackend(t *testing.T) (queue.Queue, string) {
	path := filepath.Join(t.TempDir(), "queues.db")
	e, err := queue.OpenEmbedded(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e, path
}

func sqsBackend(t *testing.T) (queue.Queue, string) {
	if fauxqs == nil {
		t.Skip("-short: fauxqs (a real component) is not started")
	}
	return queue.NewSQS(testenv.AWSConfig(), fauxqs.Endpoint), fauxqs.Endpoint
}

func TestContract(t *testing.T) {
	for name, open := range map[string]backend{"embedded": embeddedBackend, "sqs": sqsBackend} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runContract(t, open)
		})
	}
}

// env is what each contract case gets.
type env struct {
	q        queue.Queue
	endpoint string
}

// runContract is the behaviour every backend must show. Each case uses its
// own queues, so they run in parallel.
func runContract(t *testing.T, open backend) {
	q, endpoint := open(t)
	e := env{q: q, endpoint: endpoint}
	cases := []struct {
		name string
		run  func(*testing.T, env)
	}{
		{"SendReceiveDelete", testSendReceiveDelete},
		{"BatchOver10", testBatchOver10},
		{"VisibilityTimeoutRedelivery", testVisibilityRedelivery},
		{"DeadLetterAfterMaxReceives", testDeadLetter},
		{"Redrive", testRedrive},
		{"Delay", testDelay},
		{"LongPollWakesOnSend", testLongPoll},
		{"TenThousandNoneLost", testTenThousand},
		{"AbandonedMessageComesBack", testAbandoned},
		{"ConsumerRetriesFailures", testConsumerFailures},
		{"ConsumerHeartbeat", testHeartbeat},
		{"ConsumerGracefulStop", testGracefulStop},
		{"LimitsCheckedBeforeRequest", testLimits},
		{"UnknownQueue", testUnknownQueue},
		{"TraceContextRoundTrip", testTrace},
		{"EnsureIdempotentAndValidated", testEnsure},
		{"InvalidReceipt", testInvalidReceipt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, e)
		})
	}
}

var queueSeq atomic.Int64

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// newQueue ensures a queue named after the test, unique in this run.
func newQueue(t *testing.T, q queue.Queue, def queue.Definition) queue.Definition {
	t.Helper()
	base := unsafeChars.ReplaceAllString(t.Name()[strings.LastIndex(t.Name(), "/")+1:], "-")
	if len(base) > 40 {
		base = base[:40]
	}
	def.Name = fmt.Sprintf("%s-%d", base, queueSeq.Add(1))
	if def.MaxReceiveCount > 0 && def.DeadLetterQueue == "" {
		def.DeadLetterQueue = def.Name + "-dlq"
	}
	if err := q.Ensure(ctx(t), def); err != nil {
		t.Fatal(err)
	}
	return def
}

// ctx bounds a test so that a backend that hangs fails it rather than the
// whole run.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func send(t *testing.T, q queue.Queue, name string, msgs ...queue.Outgoing) []string {
	t.Helper()
	ids, err := q.Send(ctx(t), name, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func body(s string) queue.Outgoing { return queue.Outgoing{Body: []byte(s)} }

// receiveOne long-polls until a message arrives or the test's deadline.
func receiveOne(t *testing.T, q queue.Queue, name string, opts queue.ReceiveOptions) queue.Message {
	t.Helper()
	opts.Max, opts.Wait = 1, queue.MaxWait
	c := ctx(t)
	for c.Err() == nil {
		msgs, err := q.Receive(c, name, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 1 {
			return msgs[0]
		}
	}
	t.Fatalf("no message from %s", name)
	return queue.Message{}
}

func expectNone(t *testing.T, q queue.Queue, name string, wait time.Duration) {
	t.Helper()
	msgs, err := q.Receive(ctx(t), name, queue.ReceiveOptions{Max: queue.MaxBatch, Wait: wait})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) > 0 {
		t.Fatalf("got %d message(s) from %s, want none; first %q (receive %d)", len(msgs), name, msgs[0].Body, msgs[0].ReceiveCount)
	}
}

func testSendReceiveDelete(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{})
	ids := send(t, e.q, def.Name, queue.Outgoing{Body: []byte("hello"), Attributes: map[string]string{"kind": "greeting"}})
	if len(ids) != 1 || ids[0] == "" {
		t.Fatalf("ids = %q, want one ID", ids)
	}
	m := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{})
	if m.ID != ids[0] || string(m.Body) != "hello" || m.Attributes["kind"] != "greeting" || m.ReceiveCount != 1 || m.SentAt.IsZero() || m.ReceiptHandle == "" {
		t.Fatalf("received %+v, want ID %s, body hello, kind=greeting, first receive, send time and handle", m, ids[0])
	}
	// In flight for the queue's default 30s, so not delivered again.
	expectNone(t, e.q, def.Name, 0)
	if err := e.q.Delete(ctx(t), def.Name, m.ReceiptHandle); err != nil {
		t.Fatal(err)
	}
	if err := e.q.ChangeVisibility(ctx(t), def.Name, m.ReceiptHandle, time.Second); !errors.Is(err, queue.ErrInvalidReceipt) {
		t.Fatalf("change visibility of a deleted message: %v, want ErrInvalidReceipt", err)
	}
	// Deleting twice is allowed, as in SQS.
	if err := e.q.Delete(ctx(t), def.Name, m.ReceiptHandle); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

func testBatchOver10(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{})
	const n = 25
	msgs := make([]queue.Outgoing, n)
	for i := range msgs {
		msgs[i] = body("m" + strconv.Itoa(i))
	}
	ids := send(t, e.q, def.Name, msgs...)
	if len(ids) != n {
		t.Fatalf("%d ids, want %d", len(ids), n)
	}
	want := map[string]string{} // id → body
	for i, id := range ids {
		if id == "" || want[id] != "" {
			t.Fatalf("id %d is %q: empty or repeated", i, id)
		}
		want[id] = "m" + strconv.Itoa(i)
	}
	c := ctx(t)
	for len(want) > 0 && c.Err() == nil {
		got, err := e.q.Receive(c, def.Name, queue.ReceiveOptions{Max: queue.MaxBatch, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range got {
			if want[m.ID] != string(m.Body) {
				t.Fatalf("message %s has body %q, want %q", m.ID, m.Body, want[m.ID])
			}
			delete(want, m.ID)
			if err := e.q.Delete(c, def.Name, m.ReceiptHandle); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(want) > 0 {
		t.Fatalf("%d messages never received", len(want))
	}
}

func testVisibilityRedelivery(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{VisibilityTimeout: time.Second})
	send(t, e.q, def.Name, body("again"))
	first := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{})
	// Not deleted: it must come back once its second is up. Hold it longer
	// the second time so the checks below run while it is in flight.
	second := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{Visibility: time.Minute})
	if second.ID != first.ID || second.ReceiveCount != 2 || second.ReceiptHandle == first.ReceiptHandle {
		t.Fatalf("redelivered %+v after %+v, want the same ID, receive count 2 and a new handle", second, first)
	}
	// The first handle is stale: deleting with it must not delete the
	// message, and it cannot change its visibility.
	if err := e.q.Delete(ctx(t), def.Name, first.ReceiptHandle); err != nil {
		t.Fatal(err)
	}
	if err := e.q.ChangeVisibility(ctx(t), def.Name, first.ReceiptHandle, time.Minute); !errors.Is(err, queue.ErrInvalidReceipt) {
		t.Fatalf("change visibility with a stale handle: %v, want ErrInvalidReceipt", err)
	}
	if err := e.q.ChangeVisibility(ctx(t), def.Name, second.ReceiptHandle, 0); err != nil {
		t.Fatalf("current handle: %v", err)
	}
	third := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{})
	if third.ID != first.ID || third.ReceiveCount != 3 {
		t.Fatalf("after release got %+v, want %s for the third time", third, first.ID)
	}
}

func testDeadLetter(t *testing.T, e env) {
	const maxReceives = 2
	def := newQueue(t, e.q, queue.Definition{VisibilityTimeout: time.Second, MaxReceiveCount: maxReceives})
	ids := send(t, e.q, def.Name, body("poison"))
	for i := 1; i <= maxReceives; i++ {
		if m := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{}); m.ReceiveCount != i {
			t.Fatalf("receive %d has count %d", i, m.ReceiveCount)
		}
	}
	// The next receive of the source moves it; it must never be delivered
	// from the source again.
	c := ctx(t)
	for c.Err() == nil {
		got, err := e.q.Receive(c, def.Name, queue.ReceiveOptions{Max: queue.MaxBatch, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			t.Fatalf("delivered from the source for the %dth time, max receive count is %d", got[0].ReceiveCount, maxReceives)
		}
		dead, err := e.q.Receive(c, def.DeadLetterQueue, queue.ReceiveOptions{Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) == 1 {
			if dead[0].ID != ids[0] || string(dead[0].Body) != "poison" {
				t.Fatalf("dead letter %+v, want message %s", dead[0], ids[0])
			}
			return
		}
	}
	t.Fatal("message never reached the dead-letter queue")
}

func testRedrive(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{MaxReceiveCount: 1})
	producer := spanContext(t, 1)
	pctx := trace.ContextWithSpanContext(ctx(t), producer)
	want := map[string]bool{}
	var msgs []queue.Outgoing
	for i := range 3 {
		b := "dead-" + strconv.Itoa(i)
		want[b] = true
		msgs = append(msgs, queue.Outgoing{Body: []byte(b), Attributes: map[string]string{"origin": "orders"}})
	}
	if _, err := e.q.Send(pctx, def.DeadLetterQueue, msgs...); err != nil {
		t.Fatal(err)
	}
	// The operator's trace must not replace the producers'.
	octx := trace.ContextWithSpanContext(ctx(t), spanContext(t, 2))
	moved, err := e.q.Redrive(octx, def.DeadLetterQueue, def.Name)
	if err != nil || moved != 3 {
		t.Fatalf("Redrive = %d, %v; want 3 moved", moved, err)
	}
	for len(want) > 0 {
		m := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{})
		if !want[string(m.Body)] || m.Attributes["origin"] != "orders" || m.ReceiveCount != 1 {
			t.Fatalf("redriven %+v: unexpected body, lost attribute or receive count", m)
		}
		if got := trace.SpanContextFromContext(m.TraceContext(context.Background())); got.SpanID() != producer.SpanID() {
			t.Fatalf("redriven message's parent span %s, want the producer's %s", got.SpanID(), producer.SpanID())
		}
		delete(want, string(m.Body))
		if err := e.q.Delete(ctx(t), def.Name, m.ReceiptHandle); err != nil {
			t.Fatal(err)
		}
	}
	expectNone(t, e.q, def.DeadLetterQueue, 0)
	if moved, err := e.q.Redrive(ctx(t), def.DeadLetterQueue, def.Name); err != nil || moved != 0 {
		t.Fatalf("second Redrive = %d, %v; want 0", moved, err)
	}
	if _, err := e.q.Redrive(ctx(t), def.Name, def.Name); !errors.Is(err, queue.ErrInvalid) {
		t.Fatalf("Redrive into itself: %v, want ErrInvalid", err)
	}
}

func spanContext(t *testing.T, n byte) trace.SpanContext {
	t.Helper()
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0xa, n},
		SpanID:     trace.SpanID{0xb, n},
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
}

func testDelay(t *testing.T, e env) {
	// The delay is long against a short poll so that a slow machine cannot
	// make the message due before the first check.
	const delay = 5 * time.Second
	for _, tc := range []struct {
		name      string
		queue     time.Duration
		message   time.Duration
		wantDelay bool
	}{
		{"PerMessage", 0, delay, true},
		{"QueueDefault", delay, 0, true},
		{"None", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			def := newQueue(t, e.q, queue.Definition{Delay: tc.queue})
			send(t, e.q, def.Name, queue.Outgoing{Body: []byte("later"), Delay: tc.message})
			if tc.wantDelay {
				expectNone(t, e.q, def.Name, 0)
			}
			if m := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{}); string(m.Body) != "later" {
				t.Fatalf("got %q", m.Body)
			}
		})
	}
}

func testLongPoll(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{})
	type result struct {
		msgs []queue.Message
		err  error
	}
	done := make(chan result, 1)
	go func() {
		msgs, err := e.q.Receive(ctx(t), def.Name, queue.ReceiveOptions{Wait: queue.MaxWait})
		done <- result{msgs, err}
	}()
	// Give the poll a moment to start waiting; the test holds either way.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	send(t, e.q, def.Name, body("wake up"))
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.msgs) != 1 || string(r.msgs[0].Body) != "wake up" {
		t.Fatalf("long poll returned %d messages, want the one sent", len(r.msgs))
	}
	t.Logf("long poll returned %v after the send", time.Since(start))
}

func testLimits(t *testing.T, e env) {
	// A queue that does not exist: reaching the backend would give
	// ErrQueueNotFound, so the limit errors prove nothing was sent.
	const missing = "no-such-queue-limits"
	traced := trace.ContextWithSpanContext(ctx(t), spanContext(t, 3))
	attrs := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["a"+strconv.Itoa(i)] = "v"
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		msg      queue.Outgoing
		want     error
		inErrMsg []string
	}{
		{"BodyOverLimit", ctx(t), body(strings.Repeat("x", queue.MaxMessageSize+1)), queue.ErrMessageTooLarge, []string{"262145", "262144"}},
		{"BodyAndAttributesOverLimit", ctx(t), queue.Outgoing{Body: []byte(strings.Repeat("x", queue.MaxMessageSize-10)), Attributes: map[string]string{"k": "0123"}}, queue.ErrMessageTooLarge, []string{"262145", "262144"}},
		{"TraceContextCounts", traced, queue.Outgoing{Body: []byte(strings.Repeat("x", queue.MaxMessageSize-50))}, queue.ErrMessageTooLarge, []string{"262144"}},
		{"ElevenAttributes", ctx(t), queue.Outgoing{Body: []byte("x"), Attributes: attrs(11)}, queue.ErrTooManyAttributes, []string{"11", "10"}},
		{"TenPlusTraceContext", traced, queue.Outgoing{Body: []byte("x"), Attributes: attrs(10)}, queue.ErrTooManyAttributes, []string{"11", "10"}},
		{"EmptyBody", ctx(t), body(""), queue.ErrInvalid, []string{"empty"}},
		{"ControlCharacter", ctx(t), body("a\x00b"), queue.ErrInvalid, []string{"character"}},
		{"InvalidUTF8", ctx(t), body("\xff"), queue.ErrInvalid, []string{"UTF-8"}},
		{"ReservedAttributeName", ctx(t), queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"AWS.x": "v"}}, queue.ErrInvalid, []string{"AWS.x"}},
		{"EmptyAttributeValue", ctx(t), queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"k": ""}}, queue.ErrInvalid, []string{`"k"`}},
		{"DelayTooLong", ctx(t), queue.Outgoing{Body: []byte("x"), Delay: 16 * time.Minute}, queue.ErrInvalid, []string{"delay"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.q.Send(tc.ctx, missing, body("fine"), tc.msg)
			if !errors.Is(err, tc.want) || errors.Is(err, queue.ErrQueueNotFound) {
				t.Fatalf("Send: %v, want %v before any request", err, tc.want)
			}
			for _, s := range append(tc.inErrMsg, "message 1") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
	t.Run("ExactlyAtLimit", func(t *testing.T) {
		def := newQueue(t, e.q, queue.Definition{})
		send(t, e.q, def.Name, body(strings.Repeat("x", queue.MaxMessageSize)))
		if m := receiveOne(t, e.q, def.Name, queue.ReceiveOptions{}); len(m.Body) != queue.MaxMessageSize {
			t.Fatalf("received %d bytes", len(m.Body))
		}
	})
	t.Run("ReceiveOptions", func(t *testing.T) {
		for _, o := range []queue.ReceiveOptions{{Max: 11}, {Max: -1}, {Wait: 21 * time.Second}, {Visibility: -time.Second}} {
			if _, err := e.q.Receive(ctx(t), missing, o); !errors.Is(err, queue.ErrInvalid) {
				t.Errorf("Receive(%+v): %v, want ErrInvalid", o, err)
			}
		}
	})
}

func testUnknownQueue(t *testing.T, e env) {
	const missing = "no-such-queue"
	for _, tc := range []struct {
		name string
		call func(context.Context) error
	}{
		{"Send", func(c context.Context) error { _, err := e.q.Send(c, missing, body("x")); return err }},
		{"Receive", func(c context.Context) error { _, err := e.q.Receive(c, missing, queue.ReceiveOptions{}); return err }},
		{"RedriveFrom", func(c context.Context) error { _, err := e.q.Redrive(c, missing, "other-missing"); return err }},
		{"Consume", func(c context.Context) error {
			return queue.Consume(c, e.q, missing, func(context.Context, queue.Message) error { return nil }, queue.ConsumerOptions{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(ctx(t))
			if !errors.Is(err, queue.ErrQueueNotFound) {
				t.Fatalf("%v, want ErrQueueNotFound", err)
			}
			if !strings.Contains(err.Error(), `"`+missing+`"`) || !strings.Contains(err.Error(), e.endpoint) {
				t.Fatalf("error %q does not name the queue %q and the endpoint %s", err, missing, e.endpoint)
			}
		})
	}
}

func testTrace(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pctx, producer := tp.Tracer("test").Start(ctx(t), "produce", trace.WithSpanKind(trace.SpanKindProducer))
	send(t, e.q, def.Name, body("traced"))             // no trace: a message without context
	_, err := e.q.Send(pctx, def.Name, body("traced")) // with the producer's
	producer.End()
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		parents []trace.SpanContext
	)
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	err = queue.Consume(c, e.q, def.Name, func(hctx context.Context, m queue.Message) error {
		mu.Lock()
		defer mu.Unlock()
		parents = append(parents, trace.SpanContextFromContext(m.TraceContext(context.Background())))
		if len(parents) == 2 {
			cancel()
		}
		return nil
	}, queue.ConsumerOptions{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	want := producer.SpanContext()
	var found int
	for _, s := range rec.Ended() {
		if s.Name() != def.Name+" process" {
			continue
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("consumer span kind %v", s.SpanKind())
		}
		if s.Parent().IsValid() {
			if s.Parent().SpanID() != want.SpanID() || s.SpanContext().TraceID() != want.TraceID() {
				t.Errorf("consumer span parent %s in trace %s, want producer span %s in %s",
					s.Parent().SpanID(), s.SpanContext().TraceID(), want.SpanID(), want.TraceID())
			}
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%d consumer spans with a parent, want 1 (the traced message's)", found)
	}
	var remote int
	for _, p := range parents {
		if p.IsValid() && p.IsRemote() && p.SpanID() == want.SpanID() {
			remote++
		}
	}
	if remote != 1 {
		t.Fatalf("Message.TraceContext gave %v, want the producer's span once", parents)
	}
}

func testEnsure(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{VisibilityTimeout: 5 * time.Second, MaxReceiveCount: 3})
	for _, d := range []queue.Definition{
		def, // again, unchanged
		{Name: def.Name, VisibilityTimeout: time.Second, MaxReceiveCount: 5, Delay: time.Second, Retention: time.Hour},
		{Name: def.Name}, // back to defaults, without a dead-letter queue
	} {
		if err := e.q.Ensure(ctx(t), d); err != nil {
			t.Fatalf("Ensure(%+v): %v", d, err)
		}
	}
	for _, d := range []queue.Definition{
		{Name: ""},
		{Name: "has space"},
		{Name: strings.Repeat("n", 81)},
		{Name: "x", VisibilityTimeout: 13 * time.Hour},
		{Name: "x", VisibilityTimeout: -time.Second},
		{Name: "x", Retention: 30 * time.Second},
		{Name: "x", Delay: 16 * time.Minute},
		{Name: "x", MaxReceiveCount: 1001},
		{Name: "x", DeadLetterQueue: "y"},
		{Name: "x", MaxReceiveCount: 1, DeadLetterQueue: "x"},
		{Name: strings.Repeat("n", 80), MaxReceiveCount: 1},
	} {
		if err := e.q.Ensure(ctx(t), d); !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("Ensure(%+v): %v, want ErrInvalid", d, err)
		}
	}
}

func testInvalidReceipt(t *testing.T, e env) {
	def := newQueue(t, e.q, queue.Definition{})
	if err := e.q.ChangeVisibility(ctx(t), def.Name, "not-a-receipt-handle", time.Second); !errors.Is(err, queue.ErrInvalidReceipt) {
		t.Fatalf("ChangeVisibility with garbage: %v, want ErrInvalidReceipt", err)
	}
}

func TestConsumeRejectsInvalidOptions(t *testing.T) {
	t.Parallel()
	q, _ := embeddedBackend(t)
	def := newQueue(t, q, queue.Definition{})
	for _, o := range []queue.ConsumerOptions{
		{Workers: -1},
		{MaxBatch: 11},
		{Visibility: -time.Second},
		{Visibility: 13 * time.Hour},
	} {
		err := queue.Consume(ctx(t), q, def.Name, func(context.Context, queue.Message) error { return nil }, o)
		if !errors.Is(err, queue.ErrInvalid) {
			t.Errorf("Consume(%+v): %v, want ErrInvalid", o, err)
		}
	}
}
