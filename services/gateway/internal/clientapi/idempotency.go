package clientapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
)

// IdempotencyTable records the idempotency keys of messages sent to agents:
// one item per (client, agent, key), partitioned by client, expiring after
// the idempotency TTL.
var IdempotencyTable = store.Table{Name: "gateway-idempotency"}

const (
	// MaxIdempotencyKeyLen bounds SendMessageRequest.idempotency_key.
	MaxIdempotencyKeyLen = 128
	// DefaultIdempotencyTTL is how long a key is remembered by default.
	DefaultIdempotencyTTL = 24 * time.Hour
	// releaseTimeout bounds giving a key back, which runs after the caller
	// may have gone.
	releaseTimeout = 5 * time.Second
	// IdempotencyReason is the ErrorInfo reason of the ALREADY_EXISTS a
	// repeated key gets; its metadata holds request_id and agent_id.
	IdempotencyReason = "IDEMPOTENCY_KEY_REUSED"
	errorDomain       = "gateway.conclave.ai"
)

// Option configures a Server.
type Option func(*Server)

// WithIdempotency keeps idempotency keys in st (whose IdempotencyTable must
// exist) for ttl (zero: DefaultIdempotencyTTL). Without it, a request with
// an idempotency key is refused rather than sent without the guarantee.
func WithIdempotency(st store.Store, ttl time.Duration) Option {
	if ttl <= 0 {
		ttl = DefaultIdempotencyTTL
	}
	return func(s *Server) { s.idem = &idempotency{store: st, ttl: ttl, now: time.Now} }
}

func validateIdempotencyKey(key string) error {
	switch {
	case len(key) > MaxIdempotencyKeyLen:
		return status.Errorf(codes.InvalidArgument, "idempotency_key is %d bytes; at most %d are allowed", len(key), MaxIdempotencyKeyLen)
	case strings.ContainsFunc(key, unicode.IsControl):
		// Keys appear in error messages and logs; protobuf already
		// guarantees UTF-8.
		return status.Error(codes.InvalidArgument, "idempotency_key must not contain control characters")
	}
	return nil
}

// idempotency claims a key for the first request that carries it.
type idempotency struct {
	store store.Store
	ttl   time.Duration
	now   func() time.Time
}

// sent is what a key's record says of the request that first carried it:
// with history, where its answer is kept (its thread and client message
// entry); without, only its ids.
type sent struct {
	requestID, agentID, threadID, entry string
}

func sentOf(it store.Item) *sent {
	return &sent{requestID: it.Attrs["request_id"], agentID: it.Attrs["agent_id"], threadID: it.Attrs["thread_id"], entry: it.Attrs["entry"]}
}

// claim is a key held for one request until it expires, or until release
// gives it back because the agent never received the message.
type claim struct {
	idem               *idempotency
	key                store.Key
	agentID, requestID string
}

// idempotencyKey scopes key to the client and the agent. The sort key is a
// digest, so that neither the agent ID nor the client's key (up to 128
// bytes each, any text) can make a malformed or oversized store key.
func idempotencyKey(clientID, agentID, key string) store.Key {
	d := sha256.Sum256([]byte(agentID + "\x00" + key))
	return store.Key{PK: clientID, SK: hex.EncodeToString(d[:])}
}

// claim records that requestID carries key for the caller and agentID,
// and, with history, where its answer is kept (thread and entry, or ""). A
// key already recorded is ALREADY_EXISTS, naming the request that has it,
// which is returned too; a store that cannot be reached is UNAVAILABLE,
// since the message was not sent.
func (i *idempotency) claim(ctx context.Context, agentID, key, requestID, threadID, entry string) (*claim, *sent, error) {
	c := &claim{idem: i, key: idempotencyKey(auth.ClientID(ctx), agentID, key), agentID: agentID, requestID: requestID}
	attrs := map[string]string{"request_id": requestID, "agent_id": agentID}
	if entry != "" {
		attrs["thread_id"], attrs["entry"] = threadID, entry
	}
	item := store.Item{Key: c.key, Attrs: attrs, ExpiresAt: i.now().Add(i.ttl)}
	// Two tries: the holder may give the key back between the write that
	// found it and the read that names it.
	for range 2 {
		_, err := i.store.Put(ctx, IdempotencyTable.Name, item, store.IfNotExists())
		if err == nil {
			return c, nil, nil
		}
		if !errors.Is(err, store.ErrConditionFailed) {
			// The write may have landed all the same (a timeout after the
			// store applied it); the message is not sent, so the key must
			// not stay taken by it.
			_ = c.release()
			return nil, nil, server.Hide(status.New(codes.Unavailable, "the gateway's store of idempotency keys is unavailable; retry"), fmt.Errorf("recording idempotency_key: %w", err))
		}
		cur, err := i.store.Get(ctx, IdempotencyTable.Name, c.key)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, server.Hide(status.New(codes.Unavailable, "the gateway's store of idempotency keys is unavailable; retry"), fmt.Errorf("reading idempotency_key: %w", err))
		}
		return nil, sentOf(cur), alreadySent(key, agentID, cur.Attrs["request_id"])
	}
	return nil, nil, status.Errorf(codes.Aborted, "idempotency_key %q is being claimed and released concurrently; retry", key)
}

// lookup returns the record of key for the caller and agentID, or nil.
func (i *idempotency) lookup(ctx context.Context, agentID, key string) (*sent, error) {
	it, err := i.store.Get(ctx, IdempotencyTable.Name, idempotencyKey(auth.ClientID(ctx), agentID, key))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, server.Hide(status.New(codes.Unavailable, "the gateway's store of idempotency keys is unavailable; retry"), fmt.Errorf("reading idempotency_key: %w", err))
	}
	return sentOf(it), nil
}

func alreadySent(key, agentID, requestID string) error {
	st := status.Newf(codes.AlreadyExists, "message with idempotency_key %q was already sent to agent %q as request %s", key, agentID, requestID)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   IdempotencyReason,
		Domain:   errorDomain,
		Metadata: map[string]string{"request_id": requestID, "agent_id": agentID},
	}); err == nil {
		st = d
	}
	return st.Err()
}

// release gives the key back, so that a retry can send the message: only
// for a message the agent never received. It runs on a context of its own,
// since the caller's may be gone, and leaves alone a key another request
// holds.
func (c *claim) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	err := c.idem.store.Delete(ctx, IdempotencyTable.Name, c.key, store.IfAttrEquals("request_id", c.requestID))
	if errors.Is(err, store.ErrConditionFailed) {
		return nil // expired, or already given back
	}
	return err
}
