package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// LaunchRequest is what the default handler asks the runner for: an agent
// with the seed's environment.
type LaunchRequest struct {
	AgentID      string // BUB_AGENT_ID
	Workspace    string // BUB_WORKSPACE
	DefaultTopic string // BUB_DEFAULT_TOPIC: the unrouted message's topic
	BusURL       string // BUB_BUS_URL
}

// Launcher starts an agent. The runner's POST /api/v1/agents/launch is the
// production one; Launch returns once the launch is accepted, and the bus
// then waits for the agent to subscribe.
type Launcher interface {
	Launch(ctx context.Context, req LaunchRequest) error
}

// DefaultHandler takes messages on topics no subscriber matches: it has an
// agent launched for the topic, waits for it to subscribe, and delivers
// with processMessage. Concurrent messages for one topic share one launch.
type DefaultHandler struct {
	launcher     Launcher
	workspace    string
	busURL       func() string
	spawnTimeout time.Duration
	log          *slog.Logger
	broker       *Broker

	mu sync.Mutex
	// pending is the launch in progress per topic.
	pending map[string]*spawn
	// spawned maps each launched agent's id to its default topic, so that
	// its session is an agent with that topic when it initializes.
	spawned map[string]string
}

type spawn struct {
	agentID string
	done    chan struct{}
	session *Session
	err     error
}

// NewDefaultHandler returns a default handler launching agents through l;
// busURL gives the address launched agents dial.
func NewDefaultHandler(l Launcher, workspace string, busURL func() string, spawnTimeout time.Duration, logger *slog.Logger) *DefaultHandler {
	if spawnTimeout <= 0 {
		spawnTimeout = time.Minute
	}
	return &DefaultHandler{launcher: l, workspace: workspace, busURL: busURL, spawnTimeout: spawnTimeout,
		log: logger, pending: map[string]*spawn{}, spawned: map[string]string{}}
}

// spawnedAgent reports the default topic of an agent the default handler
// launched.
func (b *Broker) spawnedAgent(clientID string) (string, bool) {
	h := b.opts.DefaultHandler
	if h == nil {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.spawned[clientID]
	return t, ok
}

// take places msg with a newly launched agent, and returns its ack.
func (h *DefaultHandler) take(ctx context.Context, msg *message) Ack {
	h.mu.Lock()
	_, running := h.pending[msg.topic]
	h.mu.Unlock()
	if !running {
		// The message found no subscriber when it was routed, but a launch
		// for its topic may have finished since: its agent takes it, and
		// no second agent is launched. (Not under h.mu: routing takes
		// sessions' locks, and a session initializing holds its own while
		// it asks for h.mu.)
		if s := h.broker.anyAgentFor(msg.topic); s != nil {
			return h.broker.deliver(ctx, s, msg, 1).ack
		}
	}
	h.mu.Lock()
	sp, running := h.pending[msg.topic]
	if !running {
		sp = &spawn{agentID: "agent-" + newMessageID()[:16], done: make(chan struct{})}
		h.pending[msg.topic] = sp
		h.spawned[sp.agentID] = msg.topic
	}
	h.mu.Unlock()
	if !running {
		h.launch(ctx, msg.topic, sp)
	}
	<-sp.done
	if sp.err != nil {
		reason := fmt.Sprintf("the default handler could not start an agent for %q: %v", msg.topic, sp.err)
		ack := Ack{ClientID: sp.agentID, Message: reason}
		if r := h.broker.opts.Retries; r != nil {
			job := retryJob{MessageID: msg.id, Topic: msg.topic, Payload: msg.payload, Publisher: msg.publisher,
				LastError: reason, PublishedAt: time.Now().UTC()}
			if err := r.deadLetter(ctx, job, "spawn_failed"); err != nil {
				ack.Message += fmt.Sprintf("; and the dead letter could not be stored: %v", err)
			} else {
				ack.Message += "; dead-lettered"
			}
		}
		return ack
	}
	return h.broker.deliver(ctx, sp.session, msg, 1).ack
}

func (h *DefaultHandler) launch(ctx context.Context, t string, sp *spawn) {
	defer close(sp.done)
	ctx, cancel := context.WithTimeout(ctx, h.spawnTimeout)
	defer cancel()
	err := h.launcher.Launch(ctx, LaunchRequest{AgentID: sp.agentID, Workspace: h.workspace, DefaultTopic: t, BusURL: h.busURL()})
	if err == nil {
		sp.session, err = h.broker.waitForSubscriber(ctx, sp.agentID, t)
		if err != nil {
			err = fmt.Errorf("agent %s did not subscribe to %q within %s: %w", sp.agentID, t, h.spawnTimeout, err)
		}
	} else {
		err = fmt.Errorf("launch: %w", err)
	}
	h.mu.Lock()
	delete(h.pending, t)
	if err != nil {
		delete(h.spawned, sp.agentID)
	}
	h.mu.Unlock()
	outcome := "ok"
	if err != nil {
		outcome = "failed"
		h.log.WarnContext(ctx, "bus: default handler could not start an agent", "topic", t, "agent_id", sp.agentID, "error", err)
	}
	h.broker.opts.Metrics.spawned(ctx, outcome)
	sp.err = err
}
