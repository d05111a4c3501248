// Package registry records, cluster-wide, which gateway replica holds each
// connected agent. It is what makes a duplicate registration fail on every
// replica, not only on the one already holding the agent, and what frees a
// crashed replica's agents.
//
// Leases are per replica, not per agent, so that the store's steady-state
// writes grow with the replicas rather than with the agents:
//
//   - Each replica holds one lease, an item under "replicas" that names its
//     address and its current epoch and expires one Lease after its last
//     renewal. The replica renews it every third of the Lease (Replica.Run).
//   - Each agent's registration is an item under "agents" naming the replica
//     and the epoch it was written under, with no expiry of its own. It is
//     live while that replica's lease lives with that epoch; when the lease
//     expires, all of the replica's agents become free together.
//   - Registering is one conditional write (create if absent). A record
//     whose replica lease is gone is stale: a new claim replaces it with a
//     write conditioned on its version, so two replicas cannot both take it.
//   - A replica whose lease expired (a store outage longer than the Lease)
//     starts a new epoch and writes its agents' records again, each
//     conditioned on still holding it; an agent another replica took
//     meanwhile is told to reconnect.
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// Table is the registry's one table definition.
var Table = store.Table{Name: "gateway-agents"}

const (
	// agentsPartition holds every registration, so listing agents is one
	// ordered query.
	agentsPartition = "agents"
	// replicasPartition holds each replica's lease and address.
	replicasPartition = "replicas"
)

// Registry reads and writes registrations in a store.
type Registry struct {
	store store.Store
	now   func() time.Time
	// claims bounds the registrations talking to the store at once. In a
	// burst (a replica's restart sends thousands of agents here), the rest
	// wait their turn having cost the store nothing, instead of all sharing
	// the store's connections until their calls time out half done and are
	// retried, which wastes the store's time on work thrown away.
	claims chan struct{}

	deadMu    sync.Mutex
	dead      map[string]time.Time // server_id/epoch → when it was seen dead
	deadClock func() time.Time
}

// MaxConcurrentClaims is how many registrations a replica sends to the store
// at once: half the DynamoDB client's connections, so that the lease's
// renewals (and lookups, forwarding, idempotency keys) always find one free
// during a burst. A renewal queued behind a burst's claims would lose the
// lease, and with it every agent the burst was registering.
const MaxConcurrentClaims = store.MaxConnections / 2

// deadEpochMemory is how long a replica epoch seen dead is taken as dead
// without reading its lease again. A dead epoch never lives again (a lease
// is renewed only under its own epoch, and a new lease takes a new one), so
// this only bounds the time a clock-skew misjudgement could last; it is
// short enough for that, and long enough that a burst of re-registrations
// from one dead replica reads its lease once rather than once per agent.
const deadEpochMemory = time.Second

// New returns a Registry over s; EnsureTable must have created Table.
func New(s store.Store) *Registry {
	return &Registry{store: s, now: time.Now, claims: make(chan struct{}, MaxConcurrentClaims),
		dead: map[string]time.Time{}, deadClock: time.Now}
}

func agentKey(agentID string) store.Key    { return store.Key{PK: agentsPartition, SK: agentID} }
func replicaKey(serverID string) store.Key { return store.Key{PK: replicasPartition, SK: serverID} }

// record is an agent's registration under epoch.
func record(a *gatewayv1.Agent, epoch string) (store.Item, error) {
	// The record shows the agent as it registered; what changes while it is
	// connected (busy, queued, last seen) is asked of its replica.
	a = proto.CloneOf(a)
	a.LastSeenAt, a.Busy, a.QueuedRequests = nil, false, 0
	data, err := proto.Marshal(a)
	if err != nil {
		return store.Item{}, fmt.Errorf("registry: encode agent %q: %w", a.GetAgentId(), err)
	}
	return store.Item{
		Key:   agentKey(a.GetAgentId()),
		Data:  data,
		Attrs: map[string]string{"instance_id": a.GetInstanceId(), "server_id": a.GetServerId(), "epoch": epoch},
	}, nil
}

// leases returns every live replica lease: server ID → epoch, and address.
func (r *Registry) leases(ctx context.Context) (map[string]store.Item, error) {
	out := map[string]store.Item{}
	cursor := ""
	for {
		page, err := r.store.Query(ctx, Table.Name, store.Query{PK: replicasPartition, Limit: 1000, Cursor: cursor})
		if err != nil {
			return nil, err
		}
		for _, it := range page.Items {
			out[it.SK] = it
		}
		if page.Cursor == "" {
			return out, nil
		}
		cursor = page.Cursor
	}
}

// liveIn reports whether an agent record's replica holds a lease with the
// record's epoch.
func liveIn(leases map[string]store.Item, rec store.Item) bool {
	l, ok := leases[rec.Attrs["server_id"]]
	return ok && l.Attrs["epoch"] == rec.Attrs["epoch"]
}

// live reports whether an agent record's replica lease lives with its epoch.
func (r *Registry) live(ctx context.Context, rec store.Item) (bool, error) {
	if r.seenDead(rec) {
		return false, nil
	}
	_, live, err := r.holder(ctx, rec)
	return live, err
}

func epochKey(rec store.Item) string { return rec.Attrs["server_id"] + "/" + rec.Attrs["epoch"] }

// seenDead reports whether rec's epoch was seen dead within deadEpochMemory.
func (r *Registry) seenDead(rec store.Item) bool {
	r.deadMu.Lock()
	defer r.deadMu.Unlock()
	at, ok := r.dead[epochKey(rec)]
	return ok && r.deadClock().Sub(at) < deadEpochMemory
}

func (r *Registry) markDead(rec store.Item) {
	now := r.deadClock()
	r.deadMu.Lock()
	defer r.deadMu.Unlock()
	if len(r.dead) >= 1024 {
		for k, at := range r.dead {
			if now.Sub(at) >= deadEpochMemory {
				delete(r.dead, k)
			}
		}
	}
	if len(r.dead) < 1024 {
		r.dead[epochKey(rec)] = now
	}
}

// holder reads the lease of rec's replica, and reports whether rec lives
// under it.
func (r *Registry) holder(ctx context.Context, rec store.Item) (store.Item, bool, error) {
	l, err := r.store.Get(ctx, Table.Name, replicaKey(rec.Attrs["server_id"]))
	switch {
	case errors.Is(err, store.ErrNotFound):
		r.markDead(rec)
		return store.Item{}, false, nil
	case err != nil:
		return store.Item{}, false, err
	}
	if l.Attrs["epoch"] != rec.Attrs["epoch"] {
		r.markDead(rec)
		return l, false, nil
	}
	return l, true, nil
}

// claim writes a's registration under epoch for the replica self,
// replacing a stale one: one conditional write when the agent is free. It
// fails with ALREADY_EXISTS while a live registration of another
// connection exists.
func (r *Registry) claim(ctx context.Context, a *gatewayv1.Agent, self, epoch string) error {
	it, err := record(a, epoch)
	if err != nil {
		return err
	}
	// A few rounds at most: each lost race means another claimer won, which
	// the next round sees as a live holder.
	for range 3 {
		_, err = r.store.Put(ctx, Table.Name, it, store.IfNotExists())
		if !errors.Is(err, store.ErrConditionFailed) {
			break
		}
		cur, gerr := r.store.Get(ctx, Table.Name, it.Key)
		if errors.Is(gerr, store.ErrNotFound) {
			continue // released meanwhile
		}
		if gerr != nil {
			err = gerr
			break
		}
		if cur.Attrs["instance_id"] == a.GetInstanceId() {
			// This connection's own record, written again under a new
			// epoch while this claim was in flight.
			return nil
		}
		// A record of this replica's under its current epoch is of a
		// connection it no longer has: the replica lets one connection of
		// an agent claim at a time, and this one is it. It is what a
		// registration leaves whose write was applied though its answer
		// was lost (and whose release failed too); it is stale.
		if cur.Attrs["server_id"] != self || cur.Attrs["epoch"] != epoch {
			live, lerr := r.live(ctx, cur)
			if lerr != nil {
				err = lerr
				break
			}
			if live {
				return status.Errorf(codes.AlreadyExists, "agent %q is already connected (to gateway %s)", a.GetAgentId(), cur.Attrs["server_id"])
			}
		}
		// Stale: its replica's lease is gone, or it is this replica's
		// orphan. Replace exactly that version.
		_, err = r.store.Put(ctx, Table.Name, it, store.IfVersion(cur.Version))
		if !errors.Is(err, store.ErrConditionFailed) {
			break
		}
	}
	switch {
	case errors.Is(err, store.ErrConditionFailed):
		return status.Errorf(codes.AlreadyExists, "agent %q is already connected", a.GetAgentId())
	case err != nil:
		return storeUnavailable(fmt.Errorf("registering agent %q: %w", a.GetAgentId(), err))
	}
	return nil
}

// rewrite writes a's registration under a new epoch, if the record is still
// a's connection's or is gone; ErrConditionFailed means another connection
// holds the agent now.
func (r *Registry) rewrite(ctx context.Context, a *gatewayv1.Agent, epoch string) error {
	it, err := record(a, epoch)
	if err != nil {
		return err
	}
	_, err = r.store.Put(ctx, Table.Name, it, store.IfAttrEquals("instance_id", a.GetInstanceId()))
	if errors.Is(err, store.ErrConditionFailed) {
		// Gone (a sweeper removed it as stale while the epoch was dead):
		// nobody took it, so take it back.
		_, err = r.store.Put(ctx, Table.Name, it, store.IfNotExists())
	}
	return err
}

// Release gives up the registration if this connection still holds it.
func (r *Registry) Release(ctx context.Context, agentID, instanceID string) error {
	err := r.store.Delete(ctx, Table.Name, agentKey(agentID), store.IfAttrEquals("instance_id", instanceID))
	if errors.Is(err, store.ErrConditionFailed) {
		return nil // someone else holds it now, or it is already gone
	}
	return err
}

// Get returns a registered agent, or NOT_FOUND when it is not registered or
// its replica's lease is gone.
func (r *Registry) Get(ctx context.Context, agentID string) (*gatewayv1.Agent, error) {
	a, _, err := r.Locate(ctx, agentID)
	return a, err
}

// Locate is Get, plus the address of the replica holding the agent (from
// the lease Get reads anyway), for forwarding a request to it.
func (r *Registry) Locate(ctx context.Context, agentID string) (*gatewayv1.Agent, string, error) {
	it, err := r.store.Get(ctx, Table.Name, agentKey(agentID))
	var lease store.Item
	if err == nil {
		var live bool
		if lease, live, err = r.holder(ctx, it); err == nil && !live {
			err = store.ErrNotFound
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, "", status.Errorf(codes.NotFound, "agent %q is not connected", agentID)
	}
	if err != nil {
		return nil, "", storeUnavailable(fmt.Errorf("reading agent %q: %w", agentID, err))
	}
	a, err := decode(it)
	if err != nil {
		return nil, "", err
	}
	return a, lease.Attrs["addr"], nil
}

// List returns up to limit live registrations after cursor, in ID order. A
// page may hold fewer than limit while a cursor remains, when stale records
// were skipped.
func (r *Registry) List(ctx context.Context, limit int, cursor string) ([]*gatewayv1.Agent, string, error) {
	page, err := r.store.Query(ctx, Table.Name, store.Query{PK: agentsPartition, Limit: limit, Cursor: cursor})
	if errors.Is(err, store.ErrInvalid) {
		return nil, "", status.Error(codes.InvalidArgument, "page_token is not one this gateway issued")
	}
	if err != nil {
		return nil, "", storeUnavailable(fmt.Errorf("listing agents: %w", err))
	}
	leases, err := r.leases(ctx)
	if err != nil {
		return nil, "", storeUnavailable(fmt.Errorf("listing gateway replicas: %w", err))
	}
	out := make([]*gatewayv1.Agent, 0, len(page.Items))
	for _, it := range page.Items {
		if !liveIn(leases, it) {
			continue
		}
		a, err := decode(it)
		if err != nil {
			return nil, "", err
		}
		out = append(out, a)
	}
	return out, page.Cursor, nil
}

// Sweep deletes registrations whose replica lease is gone, each only if
// unchanged since it was read, and returns how many. Stale records are
// invisible and replaced by the next claim anyway; sweeping reclaims the
// space of agents that never come back.
func (r *Registry) Sweep(ctx context.Context) (int, error) {
	leases, err := r.leases(ctx)
	if err != nil {
		return 0, err
	}
	swept, cursor := 0, ""
	for {
		page, err := r.store.Query(ctx, Table.Name, store.Query{PK: agentsPartition, Limit: 1000, Cursor: cursor})
		if err != nil {
			return swept, err
		}
		for _, it := range page.Items {
			if liveIn(leases, it) {
				continue
			}
			err := r.store.Delete(ctx, Table.Name, it.Key, store.IfVersion(it.Version))
			switch {
			case err == nil:
				swept++
			case !errors.Is(err, store.ErrConditionFailed):
				return swept, err
			}
		}
		if page.Cursor == "" {
			return swept, nil
		}
		cursor = page.Cursor
	}
}

func decode(it store.Item) (*gatewayv1.Agent, error) {
	a := &gatewayv1.Agent{}
	if err := proto.Unmarshal(it.Data, a); err != nil {
		return nil, server.Hide(status.New(codes.Internal, "internal error"), fmt.Errorf("registry entry %q is corrupt: %w", it.SK, err))
	}
	return a, nil
}

// ReplicaAddr returns where replica serverID can be reached, or UNAVAILABLE
// when its lease is gone.
func (r *Registry) ReplicaAddr(ctx context.Context, serverID string) (string, error) {
	it, err := r.store.Get(ctx, Table.Name, replicaKey(serverID))
	if errors.Is(err, store.ErrNotFound) {
		return "", status.Errorf(codes.Unavailable, "gateway replica %q is gone", serverID)
	}
	if err != nil {
		return "", storeUnavailable(fmt.Errorf("looking up gateway replica %q: %w", serverID, err))
	}
	return it.Attrs["addr"], nil
}

// ReplicaOptions configure a replica's lease.
type ReplicaOptions struct {
	// Lease is how long the replica's lease outlives its last renewal; it
	// is renewed every third of it.
	Lease time.Duration
	// Holdings lists the agents the replica holds, so that their
	// registrations can be written again under a new epoch after the lease
	// was lost.
	Holdings func() []*gatewayv1.Agent
	// Lost is told of an agent that another connection took while this
	// replica's lease was lost; the agent must be told to reconnect.
	Lost func(agentID, instanceID string, reason error)
	// Logger receives lease trouble; nothing is logged when nil.
	Logger *slog.Logger
	// SweepEvery is how often the replica sweeps stale registrations; zero
	// means every 20 leases.
	SweepEvery time.Duration
	// Observe, when set, is told of every lease write: renewed, failed,
	// established (a new epoch) or lost (a registration another replica took).
	Observe func(event string, took time.Duration)
}

// Replica is one gateway replica's lease, and the only way it registers
// agents: Claim refuses while the lease cannot be renewed.
type Replica struct {
	reg  *Registry
	id   string
	boot string
	opts ReplicaOptions

	mu         sync.Mutex
	addr       string
	epoch      string // "" until established, and again once lost
	gen        int
	held       bool // an epoch was established before: agents may need writing again
	validUntil time.Time
	trouble    error         // why the lease cannot be relied on now; nil when renewing fine
	withdrawn  bool          // the replica gave its lease up, so its agents' records are stale already
	first      chan struct{} // closed after the first attempt to establish the lease
	firstOnce  sync.Once
}

// Replica returns serverID's lease; Run keeps it.
func (r *Registry) Replica(serverID string, opts ReplicaOptions) *Replica {
	if opts.Lease <= 0 {
		opts.Lease = 15 * time.Second
	}
	if opts.SweepEvery <= 0 {
		opts.SweepEvery = 20 * opts.Lease
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Holdings == nil {
		opts.Holdings = func() []*gatewayv1.Agent { return nil }
	}
	if opts.Lost == nil {
		opts.Lost = func(string, string, error) {}
	}
	if opts.Observe == nil {
		opts.Observe = func(string, time.Duration) {}
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return &Replica{reg: r, id: serverID, boot: hex.EncodeToString(b[:]), opts: opts,
		trouble: status.Errorf(codes.Unavailable, "gateway %s has not taken its lease in the store yet; retry", serverID),
		first:   make(chan struct{})}
}

// Boot names this process's incarnation of the replica: six hex digits,
// new at every start, for connection IDs that never repeat across restarts.
func (p *Replica) Boot() string { return p.boot }

// Claim registers a for this replica, failing with ALREADY_EXISTS while
// another connection holds it, and with UNAVAILABLE while this replica's
// lease cannot be renewed (it would not be visible, nor safe, elsewhere).
func (p *Replica) Claim(ctx context.Context, a *gatewayv1.Agent) error {
	select {
	case <-p.first:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	select {
	case p.reg.claims <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	epoch, err := p.usable()
	if err == nil {
		err = p.reg.claim(ctx, a, p.id, epoch)
	}
	<-p.reg.claims
	if err != nil {
		if status.Code(err) != codes.AlreadyExists {
			// A write reported failed may have been applied: give it back
			// (if it is this connection's), rather than leave it blocking
			// the agent's next attempt.
			_ = p.reg.Release(context.WithoutCancel(ctx), a.GetAgentId(), a.GetInstanceId())
		}
		return err
	}
	// The epoch may have changed while the write was in flight; a record
	// under a dead epoch would be invisible and free for others to take.
	for {
		cur, err := p.usable()
		if err != nil {
			// Refused after all: give the registration back rather than
			// leave it blocking the agent elsewhere until the lease ends.
			_ = p.reg.Release(context.WithoutCancel(ctx), a.GetAgentId(), a.GetInstanceId())
			return err
		}
		if cur == epoch {
			return nil
		}
		epoch = cur
		if err := p.reg.rewrite(ctx, a, epoch); err != nil {
			if errors.Is(err, store.ErrConditionFailed) {
				return status.Errorf(codes.AlreadyExists, "agent %q is already connected", a.GetAgentId())
			}
			return storeUnavailable(fmt.Errorf("registering agent %q: %w", a.GetAgentId(), err))
		}
	}
}

// Release gives up an agent's registration.
//
// After Withdraw it writes nothing: the records of a replica that gave up
// its lease are stale, free for the next registration to replace, so a
// replica shutting down with N agents makes one write rather than N.
func (p *Replica) Release(ctx context.Context, agentID, instanceID string) error {
	p.mu.Lock()
	withdrawn := p.withdrawn
	p.mu.Unlock()
	if withdrawn {
		return nil
	}
	return p.reg.Release(ctx, agentID, instanceID)
}

// usable returns the current epoch, or why registrations are refused.
func (p *Replica) usable() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.trouble != nil:
		return "", p.trouble
	case p.epoch == "" || !p.reg.now().Before(p.validUntil):
		return "", status.Errorf(codes.Unavailable, "gateway %s lost its lease in the store; retry, or connect to another replica", p.id)
	}
	return p.epoch, nil
}

// Healthy reports why the replica should not take new agents, or nil.
func (p *Replica) Healthy() error {
	_, err := p.usable()
	return err
}

// Run keeps the lease, advertising addr for forwarding, until ctx ends, and
// sweeps stale registrations now and then. A renewal that fails is retried
// with backoff; only a lease that truly expired (by this replica's clock,
// a Lease after its last renewal was sent) is given up, and a new one is
// taken as soon as the store answers again.
func (p *Replica) Run(ctx context.Context, addr string) {
	p.mu.Lock()
	p.addr = addr
	p.mu.Unlock()
	sweep := time.NewTimer(jitter(p.opts.SweepEvery))
	defer sweep.Stop()
	backoff := time.Duration(0)
	for {
		wait, ok := p.step(ctx)
		p.firstOnce.Do(func() { close(p.first) })
		if ok {
			backoff = 0
		} else {
			backoff = min(max(2*backoff, 100*time.Millisecond), p.opts.Lease/6)
			wait = backoff
		}
		select {
		case <-ctx.Done():
			return
		case <-sweep.C:
			if n, err := p.reg.Sweep(ctx); err != nil {
				p.opts.Logger.WarnContext(ctx, "could not sweep stale agent registrations", "error", err)
			} else if n > 0 {
				p.opts.Logger.InfoContext(ctx, "swept stale agent registrations", "count", n)
			}
			sweep.Reset(jitter(p.opts.SweepEvery))
		case <-time.After(wait):
		}
	}
}

// jitter spreads the replicas' sweeps.
func jitter(d time.Duration) time.Duration {
	var b [2]byte
	_, _ = rand.Read(b[:])
	r := int64(b[0])<<8 | int64(b[1])
	return d/2 + time.Duration(int64(d/2)*r/65536)
}

// step renews the lease, or takes a new one when there is none; it returns
// when to act next, and whether the store answered as hoped.
func (p *Replica) step(ctx context.Context) (time.Duration, bool) {
	start := p.reg.now()
	p.mu.Lock()
	epoch, validUntil, addr, withdrawn := p.epoch, p.validUntil, p.addr, p.withdrawn
	p.mu.Unlock()
	if withdrawn {
		return p.opts.Lease, true
	}
	if epoch == "" || !start.Before(validUntil) {
		return p.establish(ctx, start)
	}
	// Bounded by what is left of the lease: past that, the store holds
	// nothing to renew. Renewals follow each other at once when writes are
	// slow, so the lease holds while a write takes less than half of it.
	rctx, cancel := context.WithDeadline(ctx, validUntil)
	defer cancel()
	_, err := p.reg.store.Put(rctx, Table.Name, p.lease(epoch, addr, start), store.IfAttrEquals("epoch", epoch))
	took := p.reg.now().Sub(start)
	switch {
	case err == nil:
		p.mu.Lock()
		if !p.withdrawn {
			p.validUntil, p.trouble = start.Add(p.opts.Lease), nil
		}
		p.mu.Unlock()
		p.opts.Observe("renewed", took)
		return max(p.opts.Lease/3-took, 0), true
	case ctx.Err() != nil:
		return 0, true
	case errors.Is(err, store.ErrConditionFailed):
		// Expired in the store (or taken by a replica with the same
		// server ID): take a new epoch at once.
		p.opts.Observe("failed", took)
		p.opts.Logger.WarnContext(ctx, "this replica's lease expired in the store; taking a new one", "server_id", p.id)
		return p.establish(ctx, p.reg.now())
	}
	p.opts.Observe("failed", took)
	p.mu.Lock()
	// The store's error is logged below, not told to the agents refused.
	p.trouble = status.Errorf(codes.Unavailable, "gateway %s cannot renew its lease in the store; retry, or connect to another replica", p.id)
	p.mu.Unlock()
	p.opts.Logger.WarnContext(ctx, "could not renew this replica's lease; retrying", "error", err, "valid_for", validUntil.Sub(p.reg.now()))
	return 0, false
}

func (p *Replica) lease(epoch, addr string, start time.Time) store.Item {
	return store.Item{
		Key:       replicaKey(p.id),
		Attrs:     map[string]string{"addr": addr, "epoch": epoch},
		ExpiresAt: start.Add(p.opts.Lease),
	}
}

// establish takes a new lease under a new epoch; after a lost one, the
// replica's agents are registered again under it.
func (p *Replica) establish(ctx context.Context, start time.Time) (time.Duration, bool) {
	p.mu.Lock()
	p.gen++
	epoch := fmt.Sprintf("%s.%d", p.boot, p.gen)
	addr, rewrite := p.addr, p.held
	p.epoch = ""
	p.mu.Unlock()
	_, err := p.reg.store.Put(ctx, Table.Name, p.lease(epoch, addr, start), store.IfNotExists())
	took := p.reg.now().Sub(start)
	if err != nil {
		if ctx.Err() != nil {
			return 0, true
		}
		p.opts.Observe("failed", took)
		reason := "cannot take its lease in the store" // its error is logged below
		if errors.Is(err, store.ErrConditionFailed) {
			reason = "finds another live lease under its server ID: a previous run that has not expired yet (it will within the lease), or a second replica with the same CONCLAVE_GATEWAY_SERVER_ID"
		}
		p.mu.Lock()
		p.trouble = status.Errorf(codes.Unavailable, "gateway %s %s; retry, or connect to another replica", p.id, reason)
		p.mu.Unlock()
		p.opts.Logger.WarnContext(ctx, "could not take this replica's lease; retrying", "server_id", p.id, "error", err)
		return 0, false
	}
	p.opts.Observe("established", took)
	if rewrite {
		p.rewriteAll(ctx, epoch)
	}
	p.mu.Lock()
	if p.withdrawn {
		// Withdrawn while the new lease was being taken: give it up too.
		p.mu.Unlock()
		_ = p.reg.store.Delete(ctx, Table.Name, replicaKey(p.id), store.IfAttrEquals("epoch", epoch))
		return p.opts.Lease, true
	}
	p.epoch, p.validUntil, p.trouble, p.held = epoch, start.Add(p.opts.Lease), nil, true
	p.mu.Unlock()
	return max(p.opts.Lease/3-took, 0), true
}

// rewriteAll registers every held agent again under epoch, a bounded number
// at a time; those another connection took meanwhile are Lost.
func (p *Replica) rewriteAll(ctx context.Context, epoch string) {
	agents := p.opts.Holdings()
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, a := range agents {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := p.reg.rewrite(ctx, a, epoch)
			switch {
			case errors.Is(err, store.ErrConditionFailed):
				p.opts.Observe("lost", 0)
				p.opts.Lost(a.GetAgentId(), a.GetInstanceId(), status.Errorf(codes.Aborted,
					"agent %q was registered through another connection while gateway %s had lost its lease; reconnect", a.GetAgentId(), p.id))
			case err != nil && ctx.Err() == nil:
				// Still invisible to the cluster; the next claim of this
				// agent elsewhere takes it, and this stream is told then.
				p.opts.Logger.WarnContext(ctx, "could not register an agent again under the new lease", "agent_id", a.GetAgentId(), "error", err)
			}
		})
	}
	wg.Wait()
	p.opts.Logger.InfoContext(ctx, "took a new lease and registered this replica's agents again", "server_id", p.id, "agents", len(agents))
}

// Withdraw gives up the lease when the replica shuts down: its agents'
// registrations become free at once, for them to reconnect elsewhere.
func (p *Replica) Withdraw(ctx context.Context) error {
	p.mu.Lock()
	epoch := p.epoch
	p.epoch, p.trouble = "", status.Errorf(codes.Unavailable, "gateway %s is shutting down; reconnect to another replica", p.id)
	p.withdrawn = true
	p.mu.Unlock()
	if epoch == "" {
		return nil
	}
	err := p.reg.store.Delete(ctx, Table.Name, replicaKey(p.id), store.IfAttrEquals("epoch", epoch))
	if errors.Is(err, store.ErrConditionFailed) {
		return nil
	}
	return err
}

// storeUnavailable is the status of a store call that failed: the client
// is told to retry, the log (through server.Hide) gets the store's error,
// which may name keys or the caller's input.
func storeUnavailable(cause error) error {
	return server.Hide(status.New(codes.Unavailable, "the gateway's store is unavailable; retry"), cause)
}
