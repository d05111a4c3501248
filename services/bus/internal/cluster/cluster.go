// Package cluster connects the bus's replicas: each advertises its address
// in the store under a lease, forwards every message it routes to the
// others, and tells them of the agents its default handler launched.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// Table lists the live replicas: each advertises its internal address
// under a lease it renews.
var Table = store.Table{Name: "bus_replicas"}

const replicaPK = "replica"

// Options configure a Cluster.
type Options struct {
	Store    store.Store
	ServerID string
	// Addr is where the other replicas reach this one, once it listens.
	Addr func() string
	// Token is the replicas' shared peer token.
	Token string
	// Scheme is "http", or "https" when the listener serves TLS.
	Scheme string
	// Lease is how long this replica stays listed after its last renewal.
	Lease  time.Duration
	Client *http.Client
	Logger *slog.Logger
	// Throttle counts the wrong peer tokens per address, with the clients'.
	Throttle *auth.Throttle
}

// Cluster connects replicas. Every replica routes a message among its own
// subscribers, then forwards it to every other live replica over HTTP,
// which routes it among theirs: subscriptions stay in memory where their
// connections are, and no per-subscription state has to be kept in the
// store in step with connections coming and going.
type Cluster struct {
	st       store.Store
	serverID string
	addr     func() string
	token    string
	scheme   string
	lease    time.Duration
	client   *http.Client
	log      *slog.Logger
	bus      *broker.Broker
	throttle *auth.Throttle
}

// New builds a Cluster. It delivers what it receives once Attach gave it
// this replica's broker, which is built with the Cluster as its Forwarder.
func New(o Options) *Cluster {
	return &Cluster{st: o.Store, serverID: o.ServerID, addr: o.Addr, token: o.Token, scheme: o.Scheme,
		lease: o.Lease, client: o.Client, log: o.Logger, throttle: o.Throttle}
}

// Attach gives c the broker that delivers the messages and spawn events
// other replicas send.
func (c *Cluster) Attach(b *broker.Broker) { c.bus = b }

// Routes registers the receiving ends of Forward and NotifySpawn:
//
//	POST /internal/v1/deliver       a forwarded message (a streamed route: it waits for acks)
//	POST /internal/v1/spawn-events  a launched agent's event
func (c *Cluster) Routes(handle, handleStream func(pattern string, h http.Handler)) {
	handleStream("POST /internal/v1/deliver", http.HandlerFunc(c.serveDeliver))
	handle("POST /internal/v1/spawn-events", http.HandlerFunc(c.serveSpawnEvent))
}

// Advertise keeps this replica in Table until ctx ends, then withdraws it.
func (c *Cluster) Advertise(ctx context.Context) {
	t := time.NewTicker(c.lease / 3)
	defer t.Stop()
	for {
		_, err := c.st.Put(ctx, Table.Name, store.Item{Key: store.Key{PK: replicaPK, SK: c.serverID},
			Data: []byte(c.addr()), ExpiresAt: time.Now().Add(c.lease)})
		if err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "bus: could not advertise this replica; others will not forward to it", "error", err)
		}
		select {
		case <-ctx.Done():
			_ = c.st.Delete(context.WithoutCancel(ctx), Table.Name, store.Key{PK: replicaPK, SK: c.serverID})
			return
		case <-t.C:
		}
	}
}

// peers returns the other live replicas' addresses.
func (c *Cluster) peers(ctx context.Context) ([]string, error) {
	page, err := c.st.Query(ctx, Table.Name, store.Query{PK: replicaPK, Limit: 1000})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, it := range page.Items {
		if it.SK != c.serverID {
			out = append(out, string(it.Data))
		}
	}
	return out, nil
}

// NotifySpawn implements broker.SpawnNotifier: every other replica at
// once, as Forward. A replica that cannot be reached misses the event; one
// waiting for that agent then gives up at the claim's expiry.
func (c *Cluster) NotifySpawn(ctx context.Context, e broker.SpawnEvent) {
	peers, err := c.peers(ctx)
	if err != nil {
		c.log.WarnContext(ctx, "bus: could not list the other replicas", "error", err)
		return
	}
	body, err := json.Marshal(e)
	if err != nil {
		return
	}
	var wg sync.WaitGroup
	for _, addr := range peers {
		wg.Go(func() {
			if err := c.post(ctx, addr, "/internal/v1/spawn-events", body, nil); err != nil {
				c.log.WarnContext(ctx, "bus: telling a replica about a launched agent failed", "replica", addr, "agent_id", e.AgentID, "error", err)
			}
		})
	}
	wg.Wait()
}

// serveSpawnEvent is the receiving end of NotifySpawn.
func (c *Cluster) serveSpawnEvent(w http.ResponseWriter, r *http.Request) {
	if !c.authorized(w, r) {
		return
	}
	var e broker.SpawnEvent
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&e); err != nil {
		server.WriteError(w, http.StatusBadRequest, "bus: "+err.Error())
		return
	}
	c.bus.SpawnEvent(e)
	w.WriteHeader(http.StatusNoContent)
}

// authorized checks the peer token of an internal request, answering 401
// when it is wrong, 429 when its address presented too many wrong ones.
func (c *Cluster) authorized(w http.ResponseWriter, r *http.Request) bool {
	if !c.throttle.HTTP(w, r) {
		server.WriteError(w, http.StatusTooManyRequests, "bus: "+auth.ThrottledMessage)
		return false
	}
	token, ok := auth.Bearer(r.Header.Get("Authorization"))
	if !ok || !auth.NewTokens(c.token).Valid(token) {
		if r.Header.Get("Authorization") != "" {
			c.throttle.FailHTTP(r)
		}
		server.WriteError(w, http.StatusUnauthorized, "bus: forwarding needs the replicas' peer token")
		return false
	}
	return true
}

// Forward implements broker.Forwarder: every other replica at once. A
// replica that cannot be reached costs its subscribers this message (they
// get no ack), which the log records; it does not fail the publish.
func (c *Cluster) Forward(ctx context.Context, f broker.Forwarded) broker.ForwardResult {
	peers, err := c.peers(ctx)
	if err != nil {
		c.log.WarnContext(ctx, "bus: could not list the other replicas", "error", err)
		return broker.ForwardResult{}
	}
	body, err := json.Marshal(f)
	if err != nil {
		return broker.ForwardResult{}
	}
	var (
		mu  sync.Mutex
		res broker.ForwardResult
		wg  sync.WaitGroup
	)
	for _, addr := range peers {
		wg.Go(func() {
			r, err := c.forwardTo(ctx, addr, body)
			if err != nil {
				c.log.WarnContext(ctx, "bus: forwarding to a replica failed", "replica", addr, "topic", f.Topic, "error", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			res.Acks = append(res.Acks, r.Acks...)
			res.Routed = res.Routed || r.Routed
			res.Stop = res.Stop || r.Stop
		})
	}
	wg.Wait()
	return res
}

func (c *Cluster) forwardTo(ctx context.Context, addr string, body []byte) (broker.ForwardResult, error) {
	var r broker.ForwardResult
	return r, c.post(ctx, addr, "/internal/v1/deliver", body, &r)
}

// post sends body to another replica's internal path, and decodes its
// answer into out (when not nil).
func (c *Cluster) post(ctx context.Context, addr, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, "POST", c.scheme+"://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// serveDeliver is the receiving end of Forward.
func (c *Cluster) serveDeliver(w http.ResponseWriter, r *http.Request) {
	if !c.authorized(w, r) {
		return
	}
	var f broker.Forwarded
	if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
		server.WriteError(w, http.StatusBadRequest, "bus: "+err.Error())
		return
	}
	res, err := c.bus.DeliverForwarded(r.Context(), f)
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		// Refused here (an untyped payload for this replica's agent): its
		// subscribers are told in the acks.
		res = broker.ForwardResult{Acks: []broker.Ack{{ClientID: "replica " + c.serverID, Message: rpcErr.Message}}}
	} else if err != nil {
		c.log.ErrorContext(r.Context(), "bus: delivering a forwarded message failed", "error", err)
		server.WriteError(w, http.StatusInternalServerError, "bus: internal error")
		return
	}
	if res.Acks == nil {
		res.Acks = []broker.Ack{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}
