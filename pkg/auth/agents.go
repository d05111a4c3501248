package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// AgentTokens holds one token per agent_id, for agents that authenticate
// their own stream rather than act for a client, and tokens for patterns
// of agent_ids: an entry "prefix*=token" opens every agent_id that starts
// with prefix and has no token of its own ("*" alone: every such id). A
// pattern is for a registrar of many agents, such as the runner, whose
// agents' ids are made at launch; an agent listed by its own id can never
// be opened by a pattern's token.
type AgentTokens struct {
	digests map[string][sha256.Size]byte
	// patterns are the prefixes of the "prefix*" entries, longest first.
	patterns []string
	pattern  map[string][sha256.Size]byte
	required bool
	throttle *Throttle
}

// ParseAgentTokens reads "agent_id=token" pairs, each token at least
// MinTokenLength characters. When required, an agent
// without a configured token cannot register; otherwise only agents with a
// configured token must present it, and the others connect without one.
func ParseAgentTokens(pairs []string, required bool) (*AgentTokens, error) {
	t := &AgentTokens{digests: map[string][sha256.Size]byte{}, pattern: map[string][sha256.Size]byte{}, required: required}
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
		if prefix, ok := strings.CutSuffix(id, "*"); ok {
			if strings.Contains(prefix, "*") {
				return nil, fmt.Errorf("agent pattern %q: '*' may only end it", id)
			}
			t.pattern[prefix] = sha256.Sum256([]byte(tok))
			t.patterns = append(t.patterns, prefix)
		}
		t.digests[id] = sha256.Sum256([]byte(tok))
	}
	sort.Slice(t.patterns, func(i, j int) bool { return len(t.patterns[i]) > len(t.patterns[j]) })
	return t, nil
}

// WithThrottle makes Check refuse callers whose address presented too many
// wrong tokens (see Throttle), and returns t.
func (t *AgentTokens) WithThrottle(th *Throttle) *AgentTokens {
	t.throttle = th
	return t
}

// matchPattern is the token of the longest pattern agentID matches.
func (t *AgentTokens) matchPattern(agentID string) ([sha256.Size]byte, bool) {
	for _, p := range t.patterns {
		if strings.HasPrefix(agentID, p) {
			return t.pattern[p], true
		}
	}
	return [sha256.Size]byte{}, false
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
	if strings.HasSuffix(agentID, "*") {
		// A pattern's own name is not an agent's.
		known = false
	}
	if !known {
		want, known = t.matchPattern(agentID)
	}
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
