// Package registry records, cluster-wide, which gateway replica holds each
// connected agent. It is what makes a duplicate registration fail on every
// replica, not only on the one already holding the agent, and what frees a
// crashed replica's agents: each registration is a lease in the store that
// its holder renews, and a conditional write is the only way to take it.
package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/store"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// Table is the registry's one table definition.
var Table = store.Table{Name: "gateway-agents"}

// partition holds every registration, so listing agents is one ordered query.
const partition = "agents"

// Registry keeps agent leases in a store.
type Registry struct {
	store store.Store
	now   func() time.Time
}

// New returns a Registry over s; EnsureTable must have created Table.
func New(s store.Store) *Registry { return &Registry{store: s, now: time.Now} }

func key(agentID string) store.Key { return store.Key{PK: partition, SK: agentID} }

func (r *Registry) item(a *gatewayv1.Agent, lease time.Duration) (store.Item, error) {
	data, err := proto.Marshal(a)
	if err != nil {
		return store.Item{}, fmt.Errorf("registry: encode agent %q: %w", a.GetAgentId(), err)
	}
	return store.Item{
		Key:       key(a.GetAgentId()),
		Data:      data,
		Attrs:     map[string]string{"instance_id": a.GetInstanceId(), "server_id": a.GetServerId()},
		ExpiresAt: r.now().Add(lease),
	}, nil
}

// Claim takes the agent's lease, failing with ALREADY_EXISTS while another
// connection, on any replica, holds a live one.
func (r *Registry) Claim(ctx context.Context, a *gatewayv1.Agent, lease time.Duration) error {
	it, err := r.item(a, lease)
	if err != nil {
		return err
	}
	_, err = r.store.Put(ctx, Table.Name, it, store.IfNotExists())
	switch {
	case errors.Is(err, store.ErrConditionFailed):
		holder := "another connection"
		if cur, gerr := r.store.Get(ctx, Table.Name, it.Key); gerr == nil {
			holder = "gateway " + cur.Attrs["server_id"]
		}
		return status.Errorf(codes.AlreadyExists, "agent %q is already connected (to %s)", a.GetAgentId(), holder)
	case err != nil:
		return status.Errorf(codes.Unavailable, "registering agent %q: %v", a.GetAgentId(), err)
	}
	return nil
}

// Renew extends the lease held by this connection (a.instance_id). It fails
// with ABORTED when the lease was lost, e.g. after a partition long enough
// for it to expire and another replica to take the agent.
func (r *Registry) Renew(ctx context.Context, a *gatewayv1.Agent, lease time.Duration) error {
	a.LastSeenAt = timestamppb.New(r.now())
	it, err := r.item(a, lease)
	if err != nil {
		return err
	}
	_, err = r.store.Put(ctx, Table.Name, it, store.IfAttrEquals("instance_id", a.GetInstanceId()))
	switch {
	case errors.Is(err, store.ErrConditionFailed):
		return status.Errorf(codes.Aborted, "agent %q lost its registration to another connection", a.GetAgentId())
	case err != nil:
		return fmt.Errorf("registry: renew %q: %w", a.GetAgentId(), err)
	}
	return nil
}

// Release gives up the lease if this connection still holds it.
func (r *Registry) Release(ctx context.Context, agentID, instanceID string) error {
	err := r.store.Delete(ctx, Table.Name, key(agentID), store.IfAttrEquals("instance_id", instanceID))
	if errors.Is(err, store.ErrConditionFailed) {
		return nil // someone else holds it now, or it already expired
	}
	return err
}

// Get returns a registered agent, or NOT_FOUND.
func (r *Registry) Get(ctx context.Context, agentID string) (*gatewayv1.Agent, error) {
	it, err := r.store.Get(ctx, Table.Name, key(agentID))
	if errors.Is(err, store.ErrNotFound) {
		return nil, status.Errorf(codes.NotFound, "agent %q is not connected", agentID)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading agent %q: %v", agentID, err)
	}
	return decode(it)
}

// List returns up to limit registered agents after cursor, in ID order.
func (r *Registry) List(ctx context.Context, limit int, cursor string) ([]*gatewayv1.Agent, string, error) {
	page, err := r.store.Query(ctx, Table.Name, store.Query{PK: partition, Limit: limit, Cursor: cursor})
	if errors.Is(err, store.ErrInvalid) {
		return nil, "", status.Errorf(codes.InvalidArgument, "page_token: %v", err)
	}
	if err != nil {
		return nil, "", status.Errorf(codes.Unavailable, "listing agents: %v", err)
	}
	out := make([]*gatewayv1.Agent, 0, len(page.Items))
	for _, it := range page.Items {
		a, err := decode(it)
		if err != nil {
			return nil, "", err
		}
		out = append(out, a)
	}
	return out, page.Cursor, nil
}

func decode(it store.Item) (*gatewayv1.Agent, error) {
	a := &gatewayv1.Agent{}
	if err := proto.Unmarshal(it.Data, a); err != nil {
		return nil, status.Errorf(codes.Internal, "registry entry %q is corrupt: %v", it.SK, err)
	}
	return a, nil
}

// replicas holds each live replica's internal address, for forwarding.
const replicas = "replicas"

// Advertise records (or renews) where replica serverID can be reached.
func (r *Registry) Advertise(ctx context.Context, serverID, addr string, lease time.Duration) error {
	_, err := r.store.Put(ctx, Table.Name, store.Item{
		Key:       store.Key{PK: replicas, SK: serverID},
		Attrs:     map[string]string{"addr": addr},
		ExpiresAt: r.now().Add(lease),
	})
	if err != nil {
		return fmt.Errorf("registry: advertise replica %q: %w", serverID, err)
	}
	return nil
}

// Withdraw removes a replica's address when it shuts down.
func (r *Registry) Withdraw(ctx context.Context, serverID string) error {
	return r.store.Delete(ctx, Table.Name, store.Key{PK: replicas, SK: serverID})
}

// ReplicaAddr returns where replica serverID can be reached, or UNAVAILABLE
// when it has not advertised itself within its lease (it is gone).
func (r *Registry) ReplicaAddr(ctx context.Context, serverID string) (string, error) {
	it, err := r.store.Get(ctx, Table.Name, store.Key{PK: replicas, SK: serverID})
	if errors.Is(err, store.ErrNotFound) {
		return "", status.Errorf(codes.Unavailable, "gateway replica %q is gone", serverID)
	}
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "looking up gateway replica %q: %v", serverID, err)
	}
	return it.Attrs["addr"], nil
}
