package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// AgentTokens holds one token per agent_id, for agents that authenticate
// their own stream rather than act for a client.
type AgentTokens struct {
	digests  map[string][sha256.Size]byte
	required bool
	throttle *Throttle
}

// ParseAgentTokens reads "agent_id=token" pairs, each token at least
// MinTokenLength characters. When required, an agent
// without a configured token cannot register; otherwise only agents with a
// configured token must present it, and the others connect without one.
func ParseAgentTokens(pairs []string, required bool) (*AgentTokens, error) {
	t := &AgentTokens{digests: map[string][sha256.Size]byte{}, required: required}
	for i, p := range pairs {
		id, tok, ok := strings.Cut(p, "=")
		id, tok = strings.TrimSpace(id), strings.TrimSpace(tok)
		switch {
		case !ok || id == "" || tok == "":
			// The pair itself is not echoed: it holds a secret.
			return nil, fmt.Errorf("entry %d is not agent_id=token", i+1)
		case len(tok) < MinTokenLength:
			return nil, fmt.Errorf("the token of agent %q is %d characters long; every token must be at least %d", id, len(tok), MinTokenLength)
		case t.digests[id] != [sha256.Size]byte{}:
			return nil, fmt.Errorf("agent %q has more than one token", id)
		}
		t.digests[id] = sha256.Sum256([]byte(tok))
	}
	return t, nil
}

// WithThrottle makes Check refuse callers whose address presented too many
// wrong tokens (see Throttle), and returns t.
func (t *AgentTokens) WithThrottle(th *Throttle) *AgentTokens {
	t.throttle = th
	return t
}

// Len is the number of agents with a token.
func (t *AgentTokens) Len() int { return len(t.digests) }

// Check returns nil when ctx's bearer token is agentID's, or a status:
// UNAUTHENTICATED for a missing or wrong token, PERMISSION_DENIED for an
// agent that has no token while tokens are required, RESOURCE_EXHAUSTED
// while the caller's address is throttled.
func (t *AgentTokens) Check(ctx context.Context, agentID string) error {
	return t.throttle.GRPC(ctx, func(ctx context.Context) error { return t.check(ctx, agentID) })
}

func (t *AgentTokens) check(ctx context.Context, agentID string) error {
	want, known := t.digests[agentID]
	tok, presented := FromIncomingContext(ctx)
	switch {
	case !known && t.required:
		return status.Errorf(codes.PermissionDenied, "agent %q has no token configured on this gateway", agentID)
	case !known:
		return nil
	case !presented:
		return status.Errorf(codes.Unauthenticated, `agent %q must send its token as "authorization: Bearer <token>" metadata`, agentID)
	}
	got := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return status.Errorf(codes.Unauthenticated, "invalid token for agent %q", agentID)
	}
	return nil
}
