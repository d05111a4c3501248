package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/services/bus/internal/topic"
)

// Options configures a Broker. Zero values take the defaults noted.
type Options struct {
	// ServerID and Version are reported by initialize.
	ServerID string
	Version  string
	// DefaultPolicy applies to subscriptions that suggest none, and to all
	// when ClientPolicies is false.
	DefaultPolicy Policy
	// ClientPolicies lets a client's suggested policy stand.
	ClientPolicies bool
	// DeliveryTimeout bounds each delivery to a subscriber (default 30s).
	DeliveryTimeout time.Duration
	// MaxSubscriptions bounds one client's subscriptions (default 100).
	MaxSubscriptions int
	// Rate and Burst bound each client's requests per second (defaults 200
	// and 400).
	Rate  float64
	Burst int
	// Retries, when set, makes failed agent deliveries durable.
	Retries *Retries
	// DefaultHandler, when set, takes messages no subscriber matches.
	DefaultHandler *DefaultHandler
	// Forwarder, when set, carries messages to the other replicas.
	Forwarder Forwarder
	Metrics   *Metrics
	Tracer    trace.Tracer
	Logger    *slog.Logger
}

// Broker routes messages between the sessions of connected clients.
type Broker struct {
	opts Options
	log  *slog.Logger

	mu sync.RWMutex
	// subs is every subscription in subscription order. It is replaced, not
	// changed in place, so a publish can route over a snapshot.
	subs []*subscription
	seq  uint64
}

type subscription struct {
	seq     uint64
	pattern topic.Pattern
	policy  Policy
	session *Session
}

// New returns a broker.
func New(opts Options) *Broker {
	if opts.DefaultPolicy == "" {
		opts.DefaultPolicy = StopOnProcessed
	}
	if opts.DeliveryTimeout <= 0 {
		opts.DeliveryTimeout = 30 * time.Second
	}
	if opts.MaxSubscriptions <= 0 {
		opts.MaxSubscriptions = 100
	}
	if opts.Rate <= 0 {
		opts.Rate = 200
	}
	if opts.Burst <= 0 {
		opts.Burst = 400
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Tracer == nil {
		opts.Tracer = noop.NewTracerProvider().Tracer("")
	}
	if opts.Metrics == nil {
		opts.Metrics = nopMetrics()
	}
	b := &Broker{opts: opts, log: opts.Logger}
	if opts.Retries != nil {
		opts.Retries.broker = b
	}
	if opts.DefaultHandler != nil {
		opts.DefaultHandler.broker = b
	}
	return b
}

func newMessageID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (b *Broker) addSubscription(s *subscription) {
	b.mu.Lock()
	b.seq++
	s.seq = b.seq
	subs := make([]*subscription, len(b.subs), len(b.subs)+1)
	copy(subs, b.subs)
	b.subs = append(subs, s)
	b.opts.Metrics.subscribed(1)
	b.mu.Unlock()
}

func (b *Broker) removeSubscriptions(remove func(*subscription) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	before := len(b.subs)
	b.subs = slices.DeleteFunc(slices.Clone(b.subs), remove)
	if removed := before - len(b.subs); removed > 0 {
		b.opts.Metrics.subscribed(-int64(removed))
	}
}

func (b *Broker) snapshot() []*subscription {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.subs
}

// route returns the subscriptions a message on t goes to, in delivery
// order: last subscribed first ("last match wins"), one per session (a
// session's latest matching subscription stands for it), and only to
// sessions allowed to receive t.
func (b *Broker) route(t string) []*subscription {
	subs := b.snapshot()
	var (
		out []*subscription
		// The sessions matched so far: scanned while few (a publish
		// usually matches one or two), a map past that.
		few  [8]*Session
		nfew int
		seen map[*Session]struct{}
	)
	for i := len(subs) - 1; i >= 0; i-- {
		s := subs[i]
		if !s.pattern.Match(t) {
			continue
		}
		if seen == nil && slices.Contains(few[:nfew], s.session) {
			continue
		}
		if seen == nil && nfew == len(few) {
			seen = make(map[*Session]struct{}, 2*len(few))
			for _, f := range few {
				seen[f] = struct{}{}
			}
		}
		if seen != nil {
			if _, dup := seen[s.session]; dup {
				continue
			}
			seen[s.session] = struct{}{}
		} else {
			few[nfew] = s.session
			nfew++
		}
		if s.session.mayReceive(t) {
			out = append(out, s)
		}
	}
	return out
}

// message is one published message on its way.
type message struct {
	id        string
	topic     string
	payload   json.RawMessage
	publisher string
	origin    Origin
	// accepted is when this replica took the message (its publish, its
	// arrival from another replica, or its retry falling due): delivery
	// latency is measured from it.
	accepted time.Time
	// event marks an event from the events queue (PublishEvent): the
	// default handler does not take it.
	event bool
}

// from is the sender deliveries name: the publisher's from, else its
// clientId.
func (m *message) from() string {
	if m.origin.From != "" {
		return m.origin.From
	}
	return m.publisher
}

// messageID is the id deliveries name: the publisher's messageId, else the
// bus's own.
func (m *message) messageID() string {
	if m.origin.MessageID != "" {
		return m.origin.MessageID
	}
	return m.id
}

// Forwarded is a message one replica hands another: to route among its own
// subscribers, or, with ClientID, to deliver to that agent (a retry).
type Forwarded struct {
	MessageID string          `json:"message_id"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	Publisher string          `json:"publisher,omitempty"`
	Origin
	ClientID string `json:"client_id,omitempty"`
	Attempt  int    `json:"attempt,omitempty"`
}

// Origin is what a publisher said of its message beyond its topic and
// payload: the from and messageId of current bub clients. Both are the
// publisher's own claims, passed on to subscribers as given.
type Origin struct {
	From      string `json:"from,omitempty"`
	MessageID string `json:"sender_message_id,omitempty"`
}

// Forwarded's answer: the acks of the replica's subscribers, whether any
// matched, and whether one stopped propagation.
type ForwardResult struct {
	Acks   []Ack `json:"acks"`
	Routed bool  `json:"routed"`
	Stop   bool  `json:"stop"`
}

// Forwarder carries a message to every other live replica and merges
// their answers.
type Forwarder interface {
	Forward(ctx context.Context, f Forwarded) ForwardResult
}

// DeliverForwarded routes a message another replica forwarded among this
// replica's subscribers only: no default handler, no further forwarding.
func (b *Broker) DeliverForwarded(ctx context.Context, f Forwarded) (ForwardResult, error) {
	msg := &message{id: f.MessageID, topic: f.Topic, payload: f.Payload, publisher: f.Publisher, origin: f.Origin, accepted: time.Now()}
	ctx = context.WithoutCancel(ctx)
	if f.ClientID != "" {
		s := b.agentFor(f.ClientID, f.Topic)
		if s == nil {
			return ForwardResult{Acks: []Ack{}}, nil
		}
		out := b.deliver(ctx, s, msg, max(f.Attempt, 1))
		return ForwardResult{Acks: []Ack{out.ack}, Routed: true}, nil
	}
	routes := b.route(f.Topic)
	if err := b.checkTyped(routes, f.Payload); err != nil {
		return ForwardResult{}, err
	}
	acks, stop, _ := b.deliverAll(ctx, msg, routes)
	return ForwardResult{Acks: acks, Routed: len(routes) > 0, Stop: stop}, nil
}

func (b *Broker) checkTyped(routes []*subscription, payload json.RawMessage) error {
	if payloadType(payload) != "" {
		return nil
	}
	for _, r := range routes {
		if r.session.isAgent() {
			return errUntyped(fmt.Sprintf("subscriber %q is an agent, delivered with processMessage", r.session.ClientID()))
		}
	}
	return nil
}

// deliverAll delivers to routes in order under their policies, and
// reports whether one stopped propagation, and whether that left some
// route out.
func (b *Broker) deliverAll(ctx context.Context, msg *message, routes []*subscription) (acks []Ack, stop, skipped bool) {
	done := make(chan struct{})
	r := &deliveryRun{b: b, ctx: ctx, msg: msg, routes: routes, finished: func() { close(done) }}
	r.deliverNext()
	<-done
	return r.acks, r.stop, r.skipped
}

// errUntyped rejects a payload without a type where delivery needs one.
func errUntyped(why string) *jsonrpc.Error {
	return invalidParams("payload.type (a string) is required: %s", why)
}

// Publish delivers a message to the subscribers of its topic and returns
// the aggregated result.
func (b *Broker) Publish(ctx context.Context, publisher, t string, payload json.RawMessage) (*SendResult, error) {
	return b.publishWait(ctx, &message{id: newMessageID(), topic: t, payload: payload, publisher: publisher, accepted: time.Now()})
}

// publishFrom is Publish with what the publisher said of its message.
func (b *Broker) publishFrom(ctx context.Context, publisher, t string, payload json.RawMessage, origin Origin) (*SendResult, error) {
	return b.publishWait(ctx, &message{id: newMessageID(), topic: t, payload: payload, publisher: publisher, origin: origin, accepted: time.Now()})
}

// PublishEvent publishes an event from the events queue as EventPublisher:
// as Publish does, except that an event no subscriber matches is not
// taken by the default handler (the result says it was not routed). An
// event is news of work done, not work for a new agent, and the runner's
// events about the agents the default handler launches would otherwise
// have it launch an agent for each launched agent's task:{task_id}, whose
// events would launch another, without end.
func (b *Broker) PublishEvent(ctx context.Context, t string, payload json.RawMessage) (*SendResult, error) {
	return b.publishWait(ctx, &message{id: newMessageID(), topic: t, payload: payload, publisher: EventPublisher, accepted: time.Now(), event: true})
}

// publishWait is publishMessage, waiting for the result.
func (b *Broker) publishWait(ctx context.Context, msg *message) (*SendResult, error) {
	var (
		res  *SendResult
		err  error
		done = make(chan struct{})
	)
	b.publishMessage(ctx, msg, func(r *SendResult, e error) { res, err = r, e; close(done) })
	<-done
	return res, err
}

// publishAsync is Publish without a goroutine waiting: the deliveries go
// out from the calling goroutine, and done is called with the result by
// whichever goroutine sees the last answer in (the last subscriber's
// connection's read loop, usually), or by one of its own when what is
// left may block (retries to schedule, other replicas, the default
// handler).
func (b *Broker) publishAsync(ctx context.Context, publisher, t string, payload json.RawMessage, origin Origin, done func(*SendResult, error)) {
	b.publishMessage(ctx, &message{id: newMessageID(), topic: t, payload: payload, publisher: publisher, origin: origin, accepted: time.Now()}, done)
}

// publishMessage delivers msg as publishAsync says.
func (b *Broker) publishMessage(ctx context.Context, msg *message, done func(*SendResult, error)) {
	t, payload := msg.topic, msg.payload
	ctx, span := b.opts.Tracer.Start(ctx, "bus publish", spanKindServer)
	if span.IsRecording() {
		span.SetAttributes(attribute.String("messaging.system", "conclave-bus"),
			attribute.String("messaging.destination.name", t),
			attribute.String("messaging.message.id", msg.id))
	}
	// The publisher leaving does not take back an accepted message.
	ctx = detach(ctx, span)

	routes := b.route(t)
	if err := b.checkTyped(routes, payload); err != nil {
		b.opts.Metrics.published(ctx, "rejected")
		span.End()
		done(nil, err)
		return
	}
	// This replica's subscribers first, then the other replicas'.
	r := &deliveryRun{b: b, ctx: ctx, msg: msg, routes: routes}
	r.finished = func() {
		complete := func() {
			res, err := b.completePublish(ctx, msg, len(routes) > 0, r.acks, r.stop, r.skipped)
			span.End()
			done(res, err)
		}
		if b.opts.Forwarder != nil || (len(routes) == 0 && b.opts.DefaultHandler != nil && !msg.event) {
			go complete()
		} else {
			complete()
		}
	}
	r.deliverNext()
}

// detach returns ctx without its cancellation, with span on top again: a
// lookup that reaches WithoutCancel's context allocates (its Value boxes
// it), and the tracer and the trace propagation look the span up several
// times per delivery.
func detach(ctx context.Context, span trace.Span) context.Context {
	return trace.ContextWithSpan(context.WithoutCancel(ctx), span)
}

// completePublish takes a message on from its delivery to this replica's
// subscribers: to the other replicas', or to the default handler, and
// returns the publisher's result.
func (b *Broker) completePublish(ctx context.Context, msg *message, routed bool, acks []Ack, stop, skipped bool) (*SendResult, error) {
	if b.opts.Forwarder != nil {
		if stop {
			skipped = true // the other replicas' subscribers are left out
		} else {
			remote := b.opts.Forwarder.Forward(ctx, Forwarded{MessageID: msg.id, Topic: msg.topic, Payload: msg.payload, Publisher: msg.publisher, Origin: msg.origin})
			acks = append(acks, remote.Acks...)
			routed = routed || remote.Routed
		}
	}
	if routed {
		b.opts.Metrics.published(ctx, "routed")
		return &SendResult{Success: true, StopPropagation: skipped, Acks: acks}, nil
	}
	if b.opts.DefaultHandler == nil || msg.event {
		b.opts.Metrics.published(ctx, "unrouted")
		return &SendResult{Success: false, Acks: []Ack{}}, nil
	}
	if payloadType(msg.payload) == "" {
		b.opts.Metrics.published(ctx, "rejected")
		return nil, errUntyped("no subscriber matches, and the default handler delivers to a new agent with processMessage")
	}
	b.opts.Metrics.published(ctx, "default_handler")
	ack := b.opts.DefaultHandler.take(ctx, msg)
	return &SendResult{Success: true, Acks: []Ack{ack}}, nil
}

// deliveryRun delivers one message to its routes, group after group,
// without a goroutine waiting for answers: a group's requests go out, and
// its last answer, or its deadline, moves the run on, on whichever
// goroutine that happens. Only scheduling retries, which writes to the
// queue, gets a goroutine of its own.
type deliveryRun struct {
	b      *Broker
	ctx    context.Context
	msg    *message
	routes []*subscription
	// next is the first route not delivered to yet.
	next          int
	acks          []Ack
	stop, skipped bool
	finished      func()
}

// deliveryGroup is the run's deliveries in flight: one subscriber, or a
// run of continueAll subscribers, delivered to at once.
type deliveryGroup struct {
	run   *deliveryRun
	end   int // the index of the route after the group's last
	calls []delivery
	outs  []outcome
	// left counts the answers awaited, plus one held while the requests
	// go out.
	left  atomic.Int32
	timer *time.Timer
	// oneCall and oneOut are calls and outs of a group of one subscriber
	// (most groups: every route but a run of continueAll ones), in the
	// group's own allocation.
	oneCall [1]delivery
	oneOut  [1]outcome
}

// deliverNext starts the next group, or finishes the run.
func (r *deliveryRun) deliverNext() {
	if r.next == len(r.routes) {
		r.finished()
		return
	}
	i := r.next
	// A run of continueAll subscribers cannot stop propagation, so they
	// are delivered to at once.
	j := i + 1
	for r.routes[i].policy == ContinueAll && j < len(r.routes) && r.routes[j].policy == ContinueAll {
		j++
	}
	routes := r.routes[i:j]
	g := &deliveryGroup{run: r, end: j}
	if len(routes) == 1 {
		g.calls, g.outs = g.oneCall[:], g.oneOut[:]
	} else {
		g.calls, g.outs = make([]delivery, len(routes)), make([]outcome, len(routes))
	}
	g.left.Store(int32(len(routes)) + 1)
	// With several subscribers, the requests are queued, then each
	// subscriber's connection flushed: what other publishes queued for it
	// meanwhile goes out in the same write. The params are encoded once.
	var params deliveryParamsCache
	deferred := len(routes) > 1
	for k, s := range routes {
		d := &g.calls[k]
		r.b.startDelivery(r.ctx, d, s.session, r.msg, 1, &params, deferred, func(result json.RawMessage, err error) {
			g.outs[k] = r.b.finishDelivery(r.ctx, d, result, err)
			g.answered()
		})
		if d.err != nil {
			g.outs[k] = r.b.finishDelivery(r.ctx, d, nil, d.err)
			g.answered()
		}
	}
	if deferred {
		// Flushing is writing, so it is not done here: this may be the
		// publisher's read loop, which meanwhile reads the next publish
		// and queues its requests, which the flush then writes with
		// these, as NATS writes each subscriber what a read cycle of the
		// publisher brought it.
		go func() {
			for _, s := range routes {
				s.session.flush()
			}
		}()
	}
	// The group shares one deadline, as its deliveries start together.
	g.timer = time.AfterFunc(r.b.opts.DeliveryTimeout, g.timeout)
	g.answered() // the hold
}

// timeout gives up on the answers still awaited.
func (g *deliveryGroup) timeout() {
	for k := range g.calls {
		if p := g.calls[k].pending; p != nil {
			p.Abandon(context.DeadlineExceeded)
		}
	}
}

// answered counts an answer in, and moves the run on after the last.
func (g *deliveryGroup) answered() {
	if g.left.Add(-1) > 0 {
		return
	}
	g.timer.Stop()
	r := g.run
	for k := range g.outs {
		if r.b.needsRetry(g.calls[k].session, g.outs[k]) {
			go func() {
				g.scheduleRetries()
				r.afterGroup(g)
			}()
			return
		}
	}
	r.afterGroup(g)
}

// scheduleRetries schedules the retries the group's answers or failures
// ask for. Each writes to the queue; they do so at once.
func (g *deliveryGroup) scheduleRetries() {
	r := g.run
	var retries sync.WaitGroup
	for k := range g.outs {
		out, s := g.outs[k], g.calls[k].session
		if r.b.needsRetry(s, out) {
			retries.Go(func() { g.outs[k].ack.Message = r.b.opts.Retries.afterAttempt(r.ctx, r.msg, s.ClientID(), 1, out) })
		}
	}
	retries.Wait()
}

// afterGroup collects a group's acks, and delivers to the next group
// unless its subscriber stopped propagation.
func (r *deliveryRun) afterGroup(g *deliveryGroup) {
	for k := range g.outs {
		r.acks = append(r.acks, g.outs[k].ack)
	}
	if len(g.outs) == 1 && r.routes[r.next].policy.stops(g.outs[0].processed, g.outs[0].stop) {
		r.stop, r.skipped = true, g.end < len(r.routes)
		r.finished()
		return
	}
	r.next = g.end
	r.deliverNext()
}

// outcome is one delivery's result.
type outcome struct {
	ack       Ack
	processed bool
	stop      bool
	// failed: the subscriber did not answer usefully (timeout, error,
	// disconnect), so the attempt counts as failed.
	failed     bool
	retry      bool
	retryAfter time.Duration
	err        string
}

// deliver calls a subscriber, and for an agent schedules the retry its
// answer or failure asks for. attempt counts from 1.
func (b *Broker) deliver(ctx context.Context, s *Session, msg *message, attempt int) outcome {
	out := b.call(ctx, s, msg, attempt)
	if b.needsRetry(s, out) {
		out.ack.Message = b.opts.Retries.afterAttempt(ctx, msg, s.ClientID(), attempt, out)
	}
	return out
}

func (b *Broker) needsRetry(s *Session, out outcome) bool {
	return (out.failed || out.retry) && b.opts.Retries != nil && s.isAgent()
}

// call delivers once: processMessage to an agent, sendMessage to a
// base-protocol subscriber.
func (b *Broker) call(ctx context.Context, s *Session, msg *message, attempt int) outcome {
	var d delivery
	b.startDelivery(ctx, &d, s, msg, attempt, nil, false, nil)
	ctx, cancel := context.WithTimeout(ctx, b.opts.DeliveryTimeout)
	defer cancel()
	err := d.err
	var answer json.RawMessage
	if err == nil {
		err = d.pending.Wait(ctx, &answer)
	}
	return b.finishDelivery(ctx, &d, answer, err)
}

// The span options of every message, made once.
var (
	spanKindClient = trace.WithSpanKind(trace.SpanKindClient)
	spanKindServer = trace.WithSpanKind(trace.SpanKindServer)

	spanDeliverSend    = "bus deliver " + MethodSendMessage
	spanDeliverProcess = "bus deliver " + MethodProcessMessage
)

// delivery is one request to a subscriber on its way.
type delivery struct {
	session *Session
	method  string
	span    trace.Span
	pending *jsonrpc.PendingCall
	err     error // the request could not be sent
	// msgAccepted is when the message was taken, for the latency metric.
	msgAccepted time.Time
}

// deliveryParamsCache holds a message's delivery params, the same for
// every subscriber of a group, encoded and checked once.
type deliveryParamsCache struct {
	base, process *jsonrpc.Params
	err           error
}

// get returns the params of method, encoding them on first use.
func (c *deliveryParamsCache) get(method string, msg *message, attempt int) (*jsonrpc.Params, error) {
	p := &c.base
	if method == MethodProcessMessage {
		p = &c.process
	}
	if *p == nil && c.err == nil {
		if method == MethodProcessMessage {
			*p, c.err = jsonrpc.EncodeParams(processParams(msg, attempt))
		} else {
			*p, c.err = jsonrpc.EncodeParams(deliveryParams(msg))
		}
	}
	return *p, c.err
}

// startDelivery sends the request of a delivery, or with deferred queues it
// for the session's flush. Its answer goes to onDone when that is not nil
// (unless the request could not be sent: d.err), else it is waited for
// on d.pending. params, when not nil, keeps the encoded params for the
// next delivery of the same message and attempt.
func (b *Broker) startDelivery(ctx context.Context, d *delivery, s *Session, msg *message, attempt int, params *deliveryParamsCache, deferred bool, onDone func(json.RawMessage, error)) {
	if params == nil {
		params = &deliveryParamsCache{}
	}
	d.session = s
	d.method = MethodSendMessage
	spanName := spanDeliverSend
	if s.isAgent() {
		d.method = MethodProcessMessage
		spanName = spanDeliverProcess
	}
	// Everything onDone reads is set before the request goes: the answer
	// can come before start returns.
	d.msgAccepted = msg.accepted
	ctx, d.span = b.opts.Tracer.Start(ctx, spanName, spanKindClient)
	raw, err := params.get(d.method, msg, attempt)
	if err != nil {
		d.err = err
		return
	}
	if d.span.IsRecording() {
		d.span.SetAttributes(attribute.String("messaging.destination.name", msg.topic),
			attribute.String("messaging.message.id", msg.id),
			attribute.String("bus.client_id", s.ClientID()),
			attribute.Int("bus.attempt", attempt))
	}
	d.pending, d.err = s.start(ctx, d.method, raw, deferred, onDone)
}

// finishDelivery makes the outcome of a delivery from its subscriber's
// answer, or from why there was none.
func (b *Broker) finishDelivery(ctx context.Context, d *delivery, answer json.RawMessage, err error) outcome {
	defer d.span.End()
	out := outcome{ack: Ack{ClientID: d.session.ClientID()}}
	var ans subscriberAnswer
	if err == nil {
		if uerr := decodeAnswer(answer, &ans); uerr != nil {
			err = fmt.Errorf("decoding the answer to %s: %w", d.method, uerr)
		}
	}
	method := d.method
	switch {
	case err == nil:
		b.opts.Metrics.answered(ctx, method, d.msgAccepted)
		out.processed = ans.Processed != nil && *ans.Processed
		out.stop = ans.StopPropagation
		out.ack.Processed = out.processed || (ans.Processed == nil && ans.Success != nil && *ans.Success)
		out.ack.Message = ans.Message
		if ans.ShouldRetry && !out.processed {
			out.retry = true
			out.retryAfter = time.Duration(ans.RetrySeconds * float64(time.Second))
			out.err = "the subscriber asked for a retry"
			if ans.Message != "" {
				out.err += ": " + ans.Message
			}
		}
		b.opts.Metrics.delivered(ctx, method, outcomeLabel(out))
		return out
	case errors.Is(err, context.DeadlineExceeded):
		out.err = fmt.Sprintf("no answer within the delivery timeout of %s", b.opts.DeliveryTimeout)
	case errors.Is(err, jsonrpc.ErrClosed):
		out.err = "the subscriber disconnected before answering"
	default:
		var rpcErr *jsonrpc.Error
		if errors.As(err, &rpcErr) {
			out.err = fmt.Sprintf("the subscriber answered with error %d: %s", rpcErr.Code, rpcErr.Message)
		} else {
			out.err = err.Error()
		}
	}
	out.failed = true
	out.ack.Message = out.err
	d.span.SetStatus(codes.Error, out.err)
	b.opts.Metrics.delivered(ctx, method, "failed")
	return out
}

func outcomeLabel(o outcome) string {
	switch {
	case o.processed:
		return "processed"
	case o.retry:
		return "retry"
	}
	return "answered"
}

func processParams(msg *message, attempt int) json.RawMessage {
	extra, _ := json.Marshal(struct {
		MessageID string `json:"message_id"`
		Attempt   int    `json:"attempt"`
	}{msg.id, attempt})
	// The extra members go into the object, encoded once in a buffer
	// made to hold them.
	p := deliveryMembers(msg, len(extra))
	return append(append(p, ','), extra[1:]...)
}

// anyAgentFor returns the agent session a message on t would go to first.
func (b *Broker) anyAgentFor(t string) *Session {
	for _, r := range b.route(t) {
		if r.session.isAgent() {
			return r.session
		}
	}
	return nil
}

// agentFor returns the connected agent session of clientID subscribed to a
// pattern matching t.
func (b *Broker) agentFor(clientID, t string) *Session {
	for _, r := range b.route(t) {
		if r.session.ClientID() == clientID && r.session.isAgent() {
			return r.session
		}
	}
	return nil
}
