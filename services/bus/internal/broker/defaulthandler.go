package broker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/services/bus/internal/topic"
)

// LaunchRequest is what the default handler asks the runner for: an agent
// with the bub protocol's environment, and its bus token.
type LaunchRequest struct {
	AgentID      string // BUB_AGENT_ID
	Workspace    string // BUB_WORKSPACE
	DefaultTopic string // BUB_DEFAULT_TOPIC: the unrouted message's topic
	BusURL       string // BUB_BUS_URL
	// Token is BUB_TOKEN: a bearer token minted for this launch, allowed
	// exactly agent:{AgentID} and DefaultTopic. It is a secret.
	Token string
}

// Launcher starts an agent. The runner's LaunchAgent is the production
// one; Launch returns once the launch is accepted, and the bus then waits
// for the agent to subscribe.
type Launcher interface {
	Launch(ctx context.Context, req LaunchRequest) error
}

// LaunchTable holds the default handler's state, shared by the replicas
// through the store:
//
//   - claim/{topic}: the one launch under way (or just finished) for a
//     topic, written only if absent, so that replicas taking messages for
//     the same topic at once launch one agent between them. It expires
//     after the spawn timeout (and a margin), so a replica that died
//     mid-launch does not block the topic for long.
//   - agent/{agent id}: each launched agent's topic, so that whichever
//     replica the agent dials treats it as an agent with that default
//     topic.
//   - token/{sha256 of its token}: the agent's bus token, hashed.
//
// The agent and token items expire after CONCLAVE_BUS_AGENT_TOKEN_TTL.
var LaunchTable = store.Table{Name: "bus_launches"}

const (
	claimPK = "claim"
	agentPK = "agent"
	tokenPK = "token"
	// claimMargin is how long a claim outlives the spawn timeout of the
	// replica that wrote it, for the time it takes to record the outcome.
	claimMargin = 5 * time.Second
)

// Spawn event states.
const (
	// SpawnSubscribed: the launched agent subscribed to a pattern matching
	// its topic, on the replica that says so.
	SpawnSubscribed = "subscribed"
	// SpawnReady: the launching replica has recorded the launch as done.
	SpawnReady = "ready"
	// SpawnFailed: the launch failed; Error says why.
	SpawnFailed = "failed"
)

// SpawnEvent tells the replicas waiting for a launched agent what became
// of it.
type SpawnEvent struct {
	AgentID string `json:"agent_id"`
	Topic   string `json:"topic"`
	State   string `json:"state"`
	Error   string `json:"error,omitempty"`
}

// SpawnNotifier carries spawn events to every other live replica.
type SpawnNotifier interface {
	NotifySpawn(ctx context.Context, e SpawnEvent)
}

// DefaultHandlerOptions configures a DefaultHandler.
type DefaultHandlerOptions struct {
	Launcher Launcher
	// Store holds LaunchTable, shared by the replicas.
	Store     store.Store
	Workspace string
	// BusURL gives the address launched agents dial.
	BusURL func() string
	// SpawnTimeout bounds a launch and the wait for the agent's
	// subscription (default 1m).
	SpawnTimeout time.Duration
	// TokenTTL is how long a launched agent's token, and its standing as
	// the agent of its topic, stay valid (default 24h).
	TokenTTL time.Duration
	// ReplyTopics let the agents launched for some topics also publish
	// where their replies go (ParseReplyRules).
	ReplyTopics []ReplyRule
	// ServerID names this replica in claims.
	ServerID string
	// Notifier, when set, tells the other replicas about launches.
	Notifier SpawnNotifier
	Logger   *slog.Logger
}

// DefaultHandler takes messages on topics no subscriber matches: it has an
// agent launched for the topic, waits for it to subscribe, and delivers
// with processMessage. Concurrent messages for one topic share one launch,
// on one replica or several: a claim in the store picks the replica that
// launches, and the others wait for the agent it launched, wherever that
// agent subscribes.
type DefaultHandler struct {
	o      DefaultHandlerOptions
	log    *slog.Logger
	broker *Broker

	mu sync.Mutex
	// pending is this replica's wait for an agent, per topic: the first
	// message to need one claims or joins the launch, the others wait for
	// it.
	pending map[string]*spawn
	// listeners are told the spawn events of their topic.
	listeners map[string]map[chan SpawnEvent]struct{}
}

type spawn struct {
	agentID string
	done    chan struct{}
	err     error
}

// NewDefaultHandler returns a default handler launching agents through
// o.Launcher.
func NewDefaultHandler(o DefaultHandlerOptions) *DefaultHandler {
	if o.SpawnTimeout <= 0 {
		o.SpawnTimeout = time.Minute
	}
	if o.TokenTTL <= 0 {
		o.TokenTTL = 24 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &DefaultHandler{o: o, log: o.Logger, pending: map[string]*spawn{},
		listeners: map[string]map[chan SpawnEvent]struct{}{}}
}

// launchRecord is what the agent and token items hold.
type launchRecord struct {
	AgentID    string    `json:"agent_id"`
	Topic      string    `json:"topic"`
	Replica    string    `json:"replica"`
	LaunchedAt time.Time `json:"launched_at"`
}

// claimRecord is a claim item's data.
type claimRecord struct {
	AgentID string `json:"agent_id"`
	Replica string `json:"replica"`
	// State is "launching", or SpawnReady once the agent subscribed.
	State   string    `json:"state"`
	expires time.Time // the item's expiry
}

// launchIDPattern is the form of the agent ids the default handler makes;
// only such a clientId is looked up in the store at initialize.
var launchIDPattern = regexp.MustCompile(`^agent-[0-9a-f]{16}$`)

func newAgentID() string { return "agent-" + newMessageID()[:16] }

func tokenKey(token string) store.Key {
	d := sha256.Sum256([]byte(token))
	return store.Key{PK: tokenPK, SK: hex.EncodeToString(d[:])}
}

func claimKey(t string) store.Key { return store.Key{PK: claimPK, SK: t} }

// launchedAgent reports the topic of an agent the default handler
// launched, on any replica.
func (b *Broker) launchedAgent(ctx context.Context, clientID string) (string, bool) {
	h := b.opts.DefaultHandler
	if h == nil || !launchIDPattern.MatchString(clientID) {
		return "", false
	}
	it, err := h.o.Store.Get(ctx, LaunchTable.Name, store.Key{PK: agentPK, SK: clientID})
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			h.log.WarnContext(ctx, "bus: could not look up a launched agent; it is treated as any client", "client_id", clientID, "error", err)
		}
		return "", false
	}
	var rec launchRecord
	if err := json.Unmarshal(it.Data, &rec); err != nil || rec.Topic == "" {
		return "", false
	}
	return rec.Topic, true
}

// LaunchGrant returns the grant of a token the default handler minted for
// an agent it launched: exactly agent:{its id} and its topic, to publish
// and subscribe, initializing as its id only. ErrUnknownToken when no
// launch holds the token (or it expired).
func (b *Broker) LaunchGrant(ctx context.Context, token string) (Grant, error) {
	h := b.opts.DefaultHandler
	if h == nil || token == "" {
		return Grant{}, ErrUnknownToken
	}
	it, err := h.o.Store.Get(ctx, LaunchTable.Name, tokenKey(token))
	if errors.Is(err, store.ErrNotFound) {
		return Grant{}, ErrUnknownToken
	}
	if err != nil {
		return Grant{}, fmt.Errorf("looking up the token: %w", err)
	}
	var rec launchRecord
	if err := json.Unmarshal(it.Data, &rec); err != nil || rec.AgentID == "" || rec.Topic == "" {
		return Grant{}, ErrUnknownToken
	}
	patterns := []string{"agent:" + ClientIDPlaceholder, topic.Quote(rec.Topic)}
	publish := patterns
	if len(h.o.ReplyTopics) > 0 {
		publish = append(slices.Clip(patterns), ReplyPatterns(h.o.ReplyTopics, rec.Topic)...)
	}
	return Grant{ClientID: rec.AgentID, Publish: publish, Subscribe: patterns, DefaultTopic: rec.Topic,
		launchTopic: rec.Topic}, nil
}

// ReplyRule lets an agent launched for a topic that Launch matches also
// publish on Template, filled in for its topic: "{topic}" stands for the
// topic and "{topic_id}" for what follows its first ':' (all of it when
// there is none), each quoted. The launch pattern keeps a template to the
// topics it was meant for: with tg:*=outbound:{topic_id} the agent of tg:42
// may reply on outbound:42, while the agent of another prefix's topic 42
// (whoever could publish there) gets nothing.
type ReplyRule struct {
	Launch   topic.Pattern
	Template string
}

// ParseReplyRules parses reply rules written LAUNCH_PATTERN=TEMPLATE.
func ParseReplyRules(specs []string) ([]ReplyRule, error) {
	rules := make([]ReplyRule, 0, len(specs))
	for _, spec := range specs {
		launch, tmpl, ok := strings.Cut(spec, "=")
		if !ok || launch == "" || tmpl == "" {
			return nil, fmt.Errorf("%q is not LAUNCH_PATTERN=TEMPLATE (for example tg:*=outbound:{topic_id})", spec)
		}
		p, err := topic.Compile(launch)
		if err != nil {
			return nil, fmt.Errorf("%q: the launch pattern: %w", spec, err)
		}
		if err := topic.Validate(fillReply(tmpl, "tg:42")); err != nil {
			return nil, fmt.Errorf("%q: the template: %w", spec, err)
		}
		rules = append(rules, ReplyRule{Launch: p, Template: tmpl})
	}
	return rules, nil
}

// ReplyPatterns returns the patterns the rules add to the publish grant of
// an agent launched for topic t.
func ReplyPatterns(rules []ReplyRule, t string) []string {
	out := []string{}
	for _, r := range rules {
		if r.Launch.Match(t) {
			out = append(out, fillReply(r.Template, t))
		}
	}
	return out
}

func fillReply(tmpl, t string) string {
	_, id, found := strings.Cut(t, ":")
	if !found {
		id = t
	}
	return strings.NewReplacer("{topic}", topic.Quote(t), "{topic_id}", topic.Quote(id)).Replace(tmpl)
}

// SpawnEvent takes a spawn event another replica sent.
func (b *Broker) SpawnEvent(e SpawnEvent) {
	if h := b.opts.DefaultHandler; h != nil {
		h.event(e)
	}
}

// agentSubscribed is called when a launched agent subscribes to a pattern
// matching its topic: the replicas waiting for it deliver.
func (h *DefaultHandler) agentSubscribed(ctx context.Context, agentID, t string) {
	e := SpawnEvent{AgentID: agentID, Topic: t, State: SpawnSubscribed}
	h.event(e)
	if h.o.Notifier != nil {
		// Not on the subscribe's answer: a replica slow to answer must
		// not hold the agent up.
		go h.o.Notifier.NotifySpawn(context.WithoutCancel(ctx), e)
	}
}

// event hands e to this replica's listeners for its topic.
func (h *DefaultHandler) event(e SpawnEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.listeners[e.Topic] {
		select {
		case ch <- e:
		default: // a listener holds 16 unread events: a topic has few
		}
	}
}

// listen registers for the spawn events of t until stop.
func (h *DefaultHandler) listen(t string) (events <-chan SpawnEvent, stop func()) {
	ch := make(chan SpawnEvent, 16)
	h.mu.Lock()
	if h.listeners[t] == nil {
		h.listeners[t] = map[chan SpawnEvent]struct{}{}
	}
	h.listeners[t][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.listeners[t], ch)
		if len(h.listeners[t]) == 0 {
			delete(h.listeners, t)
		}
		h.mu.Unlock()
	}
}

// take places msg with an agent launched for its topic, and returns its
// ack.
func (h *DefaultHandler) take(ctx context.Context, msg *message) Ack {
	h.mu.Lock()
	_, running := h.pending[msg.topic]
	h.mu.Unlock()
	if !running {
		// The message found no subscriber when it was routed, but a launch
		// for its topic may have finished since: its agent takes it, and
		// no second agent is launched. (Not under h.mu: routing takes
		// sessions' locks.)
		if s := h.broker.anyAgentFor(msg.topic); s != nil {
			return h.broker.deliver(ctx, s, msg, 1).ack
		}
	}
	h.mu.Lock()
	sp, running := h.pending[msg.topic]
	if !running {
		sp = &spawn{done: make(chan struct{})}
		h.pending[msg.topic] = sp
	}
	h.mu.Unlock()
	if !running {
		h.obtain(ctx, msg.topic, sp)
	}
	<-sp.done
	if sp.err != nil {
		reason := fmt.Sprintf("the default handler could not start an agent for %q: %v", msg.topic, sp.err)
		ack := Ack{ClientID: sp.agentID, Message: reason}
		if r := h.broker.opts.Retries; r != nil {
			job := retryJob{MessageID: msg.id, Topic: msg.topic, Payload: msg.payload, Publisher: msg.publisher, Origin: msg.origin,
				LastError: reason, PublishedAt: time.Now().UTC()}
			if err := r.deadLetter(ctx, job, "spawn_failed"); err != nil {
				ack.Message += fmt.Sprintf("; and the dead letter could not be stored: %v", err)
			} else {
				ack.Message += "; dead-lettered"
			}
		}
		return ack
	}
	return h.deliverTo(ctx, sp.agentID, msg)
}

// obtain finds the agent for topic t: it claims the launch and launches,
// or joins the launch another replica claimed.
func (h *DefaultHandler) obtain(ctx context.Context, t string, sp *spawn) {
	defer func() {
		h.mu.Lock()
		delete(h.pending, t)
		h.mu.Unlock()
		close(sp.done)
	}()
	ctx, cancel := context.WithTimeout(ctx, h.o.SpawnTimeout)
	defer cancel()
	// Listening before the claim is read: an event sent after the read
	// cannot be missed.
	events, stop := h.listen(t)
	defer stop()
	for range 3 {
		agentID := newAgentID()
		claimed, cur, err := h.claim(ctx, t, agentID)
		switch {
		case err != nil:
			sp.err = fmt.Errorf("claiming the launch in the store: %w", err)
		case claimed:
			sp.agentID = agentID
			sp.err = h.launch(ctx, t, agentID, events)
		case cur == nil:
			continue // the claim ended between the write and the read
		case cur.State == SpawnReady:
			sp.agentID = cur.AgentID
		default:
			// Another replica (or this one before a restart) is launching:
			// its agent takes the message, wherever it subscribes.
			sp.agentID = cur.AgentID
			wctx, wcancel := context.WithDeadline(ctx, cur.expires)
			if err := h.awaitAgent(wctx, cur.AgentID, t, events); err != nil {
				sp.err = fmt.Errorf("agent %s, launched by replica %s, did not subscribe to %q in time: %w", cur.AgentID, cur.Replica, t, err)
			}
			wcancel()
		}
		return
	}
	sp.err = errors.New("the launch claim in the store kept changing")
}

// claim writes the claim of t for agentID if there is none; otherwise it
// returns the claim in force (nil if it ended meanwhile).
func (h *DefaultHandler) claim(ctx context.Context, t, agentID string) (bool, *claimRecord, error) {
	data, err := json.Marshal(claimRecord{AgentID: agentID, Replica: h.o.ServerID, State: "launching"})
	if err != nil {
		return false, nil, err
	}
	_, err = h.o.Store.Put(ctx, LaunchTable.Name, store.Item{Key: claimKey(t), Data: data,
		Attrs: map[string]string{"agent_id": agentID}, ExpiresAt: time.Now().Add(h.o.SpawnTimeout + claimMargin)}, store.IfNotExists())
	if err == nil {
		return true, nil, nil
	}
	if !errors.Is(err, store.ErrConditionFailed) {
		return false, nil, err
	}
	it, err := h.o.Store.Get(ctx, LaunchTable.Name, claimKey(t))
	if errors.Is(err, store.ErrNotFound) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, err
	}
	var cur claimRecord
	if err := json.Unmarshal(it.Data, &cur); err != nil {
		return false, nil, fmt.Errorf("claim of %q: %w", t, err)
	}
	cur.expires = it.ExpiresAt
	return false, &cur, nil
}

// launch records the agent and its token, asks the launcher for it, waits
// for its subscription, and records the outcome for the other replicas.
func (h *DefaultHandler) launch(ctx context.Context, t, agentID string, events <-chan SpawnEvent) error {
	token, err := h.register(ctx, t, agentID)
	if err != nil {
		err = fmt.Errorf("recording the launch: %w", err)
	} else if err = h.o.Launcher.Launch(ctx, LaunchRequest{AgentID: agentID, Workspace: h.o.Workspace,
		DefaultTopic: t, BusURL: h.o.BusURL(), Token: token}); err != nil {
		err = fmt.Errorf("launch: %w", err)
	} else if err = h.awaitAgent(ctx, agentID, t, events); err != nil {
		err = fmt.Errorf("agent %s did not subscribe to %q within %s: %w", agentID, t, h.o.SpawnTimeout, err)
	}
	bg := context.WithoutCancel(ctx)
	e := SpawnEvent{AgentID: agentID, Topic: t, State: SpawnReady}
	outcome := "ok"
	if err != nil {
		outcome = "failed"
		e.State, e.Error = SpawnFailed, err.Error()
		h.log.WarnContext(ctx, "bus: default handler could not start an agent", "topic", t, "agent_id", agentID, "error", err)
		for _, k := range []store.Key{{PK: agentPK, SK: agentID}, tokenKey(token)} {
			if token == "" && k.PK == tokenPK {
				continue
			}
			if derr := h.o.Store.Delete(bg, LaunchTable.Name, k); derr != nil {
				h.log.WarnContext(ctx, "bus: could not withdraw a failed launch's record; it expires", "agent_id", agentID, "error", derr)
			}
		}
		if derr := h.o.Store.Delete(bg, LaunchTable.Name, claimKey(t), store.IfAttrEquals("agent_id", agentID)); derr != nil && !errors.Is(derr, store.ErrConditionFailed) {
			h.log.WarnContext(ctx, "bus: could not withdraw a failed launch's claim; it expires", "topic", t, "error", derr)
		}
	} else {
		// The claim stays a while, ready: a message routed before the
		// agent subscribed, and taken by a replica after this, goes to it
		// instead of launching another.
		data, _ := json.Marshal(claimRecord{AgentID: agentID, Replica: h.o.ServerID, State: SpawnReady})
		if _, perr := h.o.Store.Put(bg, LaunchTable.Name, store.Item{Key: claimKey(t), Data: data,
			Attrs: map[string]string{"agent_id": agentID}, ExpiresAt: time.Now().Add(h.o.SpawnTimeout)},
			store.IfAttrEquals("agent_id", agentID)); perr != nil && !errors.Is(perr, store.ErrConditionFailed) {
			h.log.WarnContext(ctx, "bus: could not record a launch as ready", "topic", t, "error", perr)
		}
	}
	h.event(e)
	if h.o.Notifier != nil {
		h.o.Notifier.NotifySpawn(bg, e)
	}
	h.broker.opts.Metrics.spawned(ctx, outcome)
	return err
}

// register stores the launched agent's record and its new token, hashed.
func (h *DefaultHandler) register(ctx context.Context, t, agentID string) (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	token := "bub_" + hex.EncodeToString(raw[:])
	now := time.Now().UTC()
	data, err := json.Marshal(launchRecord{AgentID: agentID, Topic: t, Replica: h.o.ServerID, LaunchedAt: now})
	if err != nil {
		return "", err
	}
	expires := now.Add(h.o.TokenTTL)
	for _, k := range []store.Key{{PK: agentPK, SK: agentID}, tokenKey(token)} {
		if _, err := h.o.Store.Put(ctx, LaunchTable.Name, store.Item{Key: k, Data: data, ExpiresAt: expires}); err != nil {
			return "", err
		}
	}
	return token, nil
}

// awaitAgent waits for agentID to subscribe to a pattern matching t, on
// this replica or another, or for its launch to fail.
func (h *DefaultHandler) awaitAgent(ctx context.Context, agentID, t string, events <-chan SpawnEvent) error {
	if h.broker.agentFor(agentID, t) != nil {
		return nil
	}
	for {
		select {
		case e := <-events:
			if e.AgentID != agentID {
				continue
			}
			switch e.State {
			case SpawnSubscribed, SpawnReady:
				return nil
			case SpawnFailed:
				return errors.New(e.Error)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// deliverTo delivers msg to agentID: here if it is connected here, else
// through the replica holding it. An agent connected nowhere is a failed
// attempt, retried.
func (h *DefaultHandler) deliverTo(ctx context.Context, agentID string, msg *message) Ack {
	if s := h.broker.agentFor(agentID, msg.topic); s != nil {
		return h.broker.deliver(ctx, s, msg, 1).ack
	}
	if f := h.broker.opts.Forwarder; f != nil {
		res := f.Forward(ctx, Forwarded{MessageID: msg.id, Topic: msg.topic, Payload: msg.payload,
			Publisher: msg.publisher, Origin: msg.origin, ClientID: agentID, Attempt: 1})
		if res.Routed && len(res.Acks) > 0 {
			return res.Acks[0]
		}
	}
	out := outcome{failed: true, err: fmt.Sprintf("agent %q is not connected and subscribed to %q", agentID, msg.topic)}
	ack := Ack{ClientID: agentID, Message: out.err}
	if r := h.broker.opts.Retries; r != nil {
		ack.Message = r.afterAttempt(ctx, msg, agentID, 1, out)
	}
	return ack
}
