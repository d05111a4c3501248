// Package access authenticates the Librarian's callers: agents, each with
// its own bearer tokens, and human reviewers. A token is
// "lib_<id>_<secret>"; the store keeps only the secret's SHA-256 under the
// id, and compares digests in constant time, so neither the table nor the
// comparison's timing gives a token away. Revoked tokens stay, marked, so
// that an audit can still name their holder.
package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/store"
)

// Table holds tokens, one item per token id.
var Table = store.Table{Name: "librarian-tokens"}

// Roles a token may carry.
const (
	RoleAgent    = "agent"
	RoleReviewer = "reviewer"
)

// Principal is an authenticated caller.
type Principal struct {
	// Subject is the agent id or the reviewer's name.
	Subject string
	Role    string
	// TokenID names the token, safe to log.
	TokenID string
}

// ErrUnauthenticated is returned for a missing, malformed, unknown or
// revoked token; the API answers it with 401.
var ErrUnauthenticated = errors.New("unauthenticated")

type record struct {
	Subject   string    `json:"subject"`
	Role      string    `json:"role"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// The patterns leave lengths to the code: a counted repetition such as
// [A-Za-z0-9._@-]{0,63} compiles to that many copies of its class, and
// compiling these at package initialization took a measurable part of the
// Lambda's cold start (bench/librarian).
var (
	tokenPattern   = regexp.MustCompile(`^lib_([0-9a-f]+)_([A-Za-z0-9_-]+)$`)
	subjectPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]*$`)
)

// parseToken splits a token, lib_<16 hex digits>_<43 base64url
// characters>, into its id and its secret.
func parseToken(token string) (id, secret string, ok bool) {
	m := tokenPattern.FindStringSubmatch(token)
	if m == nil || len(m[1]) != 16 || len(m[2]) != 43 {
		return "", "", false
	}
	return m[1], m[2], true
}

// ValidSubject reports whether s looks like an agent id or a reviewer
// name: 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a
// letter or digit.
func ValidSubject(s string) bool { return len(s) <= 64 && subjectPattern.MatchString(s) }

// Tokens keeps tokens in a store.
type Tokens struct {
	st  store.Store
	now func() time.Time
}

// New returns Tokens over st; Table must exist.
func New(st store.Store) *Tokens { return &Tokens{st: st, now: time.Now} }

func key(id string) store.Key { return store.Key{PK: "tokens", SK: id} }

// Create issues a token for subject in role and returns it; it is shown
// this once and never stored.
func (t *Tokens) Create(ctx context.Context, subject, role string) (token, id string, err error) {
	if !ValidSubject(subject) {
		return "", "", fmt.Errorf("access: %q is not a valid agent id or reviewer name", subject)
	}
	if role != RoleAgent && role != RoleReviewer {
		return "", "", fmt.Errorf("access: unknown role %q", role)
	}
	idBytes, secret := make([]byte, 8), make([]byte, 32)
	_, _ = rand.Read(idBytes)
	_, _ = rand.Read(secret)
	id = hex.EncodeToString(idBytes)
	enc := base64.RawURLEncoding.EncodeToString(secret)
	data, _ := json.Marshal(record{Subject: subject, Role: role, Digest: digest(enc), CreatedAt: t.now().UTC()})
	if _, err := t.st.Put(ctx, Table.Name, store.Item{Key: key(id), Data: data, Attrs: map[string]string{"subject": subject}}, store.IfNotExists()); err != nil {
		return "", "", fmt.Errorf("access: store token: %w", err)
	}
	return "lib_" + id + "_" + enc, id, nil
}

func digest(secret string) string {
	d := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(d[:])
}

// Revoke marks token id revoked; later requests with it get 401.
func (t *Tokens) Revoke(ctx context.Context, id string) error {
	it, err := t.st.Get(ctx, Table.Name, key(id))
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("access: no token %q", id)
	}
	if err != nil {
		return fmt.Errorf("access: read token: %w", err)
	}
	var r record
	if err := json.Unmarshal(it.Data, &r); err != nil {
		return fmt.Errorf("access: token %s is corrupt: %w", id, err)
	}
	if !r.RevokedAt.IsZero() {
		return nil
	}
	r.RevokedAt = t.now().UTC()
	data, _ := json.Marshal(r)
	if _, err := t.st.Put(ctx, Table.Name, store.Item{Key: it.Key, Data: data, Attrs: it.Attrs}, store.IfVersion(it.Version)); err != nil {
		return fmt.Errorf("access: revoke %s: %w", id, err)
	}
	return nil
}

// Verify returns the holder of token.
func (t *Tokens) Verify(ctx context.Context, token string) (Principal, error) {
	id, secret, ok := parseToken(token)
	if !ok {
		return Principal{}, fmt.Errorf("%w: malformed token", ErrUnauthenticated)
	}
	it, err := t.st.Get(ctx, Table.Name, key(id))
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	if err != nil {
		return Principal{}, fmt.Errorf("access: read token: %w", err)
	}
	var r record
	if err := json.Unmarshal(it.Data, &r); err != nil {
		return Principal{}, fmt.Errorf("access: token %s is corrupt: %w", id, err)
	}
	want, _ := hex.DecodeString(r.Digest)
	got := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(got[:], want) != 1 {
		return Principal{}, fmt.Errorf("%w: unknown token", ErrUnauthenticated)
	}
	if !r.RevokedAt.IsZero() {
		return Principal{}, fmt.Errorf("%w: token revoked", ErrUnauthenticated)
	}
	return Principal{Subject: r.Subject, Role: r.Role, TokenID: id}, nil
}

// TokenID returns the id part of a token, or "" when it is not one; it is
// what revoke takes.
func TokenID(token string) string {
	id, _, _ := parseToken(token)
	return id
}

// Static are tokens given in the configuration (subject=token pairs), for a
// first reviewer and for development, held only as digests.
type Static struct {
	entries []staticEntry
}

type staticEntry struct {
	subject, role string
	digest        [sha256.Size]byte
}

// ParseStatic reads "subject=token" pairs for role. The pair is never
// echoed in an error: it holds a secret.
func ParseStatic(pairs []string, role string, into *Static) error {
	for i, p := range pairs {
		subject, tok, ok := strings.Cut(p, "=")
		subject, tok = strings.TrimSpace(subject), strings.TrimSpace(tok)
		if !ok || !ValidSubject(subject) || len(tok) < auth.MinTokenLength {
			return fmt.Errorf("entry %d is not name=token with a token of %d characters or more", i+1, auth.MinTokenLength)
		}
		into.entries = append(into.entries, staticEntry{subject: subject, role: role, digest: sha256.Sum256([]byte(tok))})
	}
	return nil
}

// Verify checks token against every static entry, all of them, so the time
// taken does not say which matched.
func (s *Static) Verify(token string) (Principal, bool) {
	d := sha256.Sum256([]byte(token))
	var found Principal
	matched := 0
	for _, e := range s.entries {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			found, matched = Principal{Subject: e.subject, Role: e.role, TokenID: "static:" + e.subject}, 1
		}
	}
	return found, matched == 1
}
