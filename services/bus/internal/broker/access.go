package broker

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/conclave-ai/conclave/services/bus/internal/topic"
)

// ClientIDPlaceholder in a grant's patterns stands for the client's own id,
// so one grant can confine every agent to agent:{client_id}.
const ClientIDPlaceholder = "{client_id}"

// Grant is what the holder of one bearer token may do.
type Grant struct {
	// Token is the bearer token. It is never logged.
	Token string `json:"token"`
	// ClientID, when set, is the only clientId the token may initialize as.
	ClientID string `json:"client_id,omitempty"`
	// Publish and Subscribe are topic patterns (fnmatch globs, with
	// {client_id} replaced by the client's id).
	Publish   []string `json:"publish"`
	Subscribe []string `json:"subscribe"`
	// DefaultTopic is where the client's sendMessage without a topic goes.
	DefaultTopic string `json:"default_topic,omitempty"`
	// Admin may list and redrive dead letters.
	Admin bool `json:"admin,omitempty"`
	// launchTopic is set on the grant of a token the default handler
	// minted: the topic its agent was launched for.
	launchTopic string
}

// OpenGrant is the grant of every client when tokens are not required
// (conclave dev, on loopback): everything is allowed.
var OpenGrant = Grant{Publish: []string{"*"}, Subscribe: []string{"*"}, Admin: true}

// Access resolves bearer tokens to grants.
type Access struct {
	grants []hashedGrant
}

type hashedGrant struct {
	digest [sha256.Size]byte
	grant  Grant
}

// ParseGrants decodes the JSON array of grants of CONCLAVE_BUS_GRANTS and
// checks every pattern.
func ParseGrants(raw string) (*Access, error) {
	a := &Access{}
	if strings.TrimSpace(raw) == "" {
		return a, nil
	}
	var grants []Grant
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&grants); err != nil {
		return nil, fmt.Errorf("not a JSON array of grants: %w", err)
	}
	seen := map[[sha256.Size]byte]bool{}
	for i, g := range grants {
		if len(g.Token) < 16 {
			return nil, fmt.Errorf("grant %d: token must be at least 16 characters", i)
		}
		d := sha256.Sum256([]byte(g.Token))
		if seen[d] {
			return nil, fmt.Errorf("grant %d: the same token appears twice", i)
		}
		seen[d] = true
		for _, p := range append(append([]string{}, g.Publish...), g.Subscribe...) {
			if err := topic.Validate(strings.ReplaceAll(p, ClientIDPlaceholder, "x")); err != nil {
				return nil, fmt.Errorf("grant %d: pattern %q: %w", i, p, err)
			}
		}
		a.grants = append(a.grants, hashedGrant{digest: d, grant: g})
	}
	return a, nil
}

// Len is how many tokens are configured.
func (a *Access) Len() int { return len(a.grants) }

// ErrUnknownToken is returned for a token no grant holds.
var ErrUnknownToken = errors.New("unknown bearer token")

// Lookup returns the grant of token, comparing digests in constant time.
func (a *Access) Lookup(token string) (Grant, error) {
	d := sha256.Sum256([]byte(token))
	found := -1
	for i := range a.grants {
		if subtle.ConstantTimeCompare(d[:], a.grants[i].digest[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Grant{}, ErrUnknownToken
	}
	return a.grants[found].grant, nil
}

// permissions is a grant compiled for one client id.
type permissions struct {
	publish, subscribe []topic.Pattern
	defaultTopic       string
	admin              bool
}

func compileGrant(g Grant, clientID string) (*permissions, error) {
	compile := func(srcs []string) ([]topic.Pattern, error) {
		out := make([]topic.Pattern, 0, len(srcs))
		for _, s := range srcs {
			p, err := topic.Compile(strings.ReplaceAll(s, ClientIDPlaceholder, clientID))
			if err != nil {
				return nil, fmt.Errorf("pattern %q for client %q: %w", s, clientID, err)
			}
			out = append(out, p)
		}
		return out, nil
	}
	pub, err := compile(g.Publish)
	if err != nil {
		return nil, err
	}
	sub, err := compile(g.Subscribe)
	if err != nil {
		return nil, err
	}
	return &permissions{publish: pub, subscribe: sub, admin: g.Admin,
		defaultTopic: strings.ReplaceAll(g.DefaultTopic, ClientIDPlaceholder, clientID)}, nil
}

func anyMatch(ps []topic.Pattern, s string) bool {
	for _, p := range ps {
		if p.Match(s) {
			return true
		}
	}
	return false
}

// mayPublish reports whether the client may publish on topic.
func (p *permissions) mayPublish(t string) bool { return anyMatch(p.publish, t) }

// maySubscribe reports whether the client may subscribe with pattern: one
// of its patterns must cover the requested one read as text (so
// "inbound:*" allows "inbound:chat-*"). Delivery checks each topic again
// with mayReceive, so a pattern that slips through this textual test still
// never carries a topic outside the grant.
func (p *permissions) maySubscribe(pattern string) bool {
	for _, allowed := range p.subscribe {
		if allowed.String() == pattern || allowed.Match(pattern) {
			return true
		}
	}
	return false
}

// mayReceive reports whether a message on topic may be delivered to the
// client.
func (p *permissions) mayReceive(t string) bool { return anyMatch(p.subscribe, t) }
