// Package auth checks bearer tokens on Conclave's gRPC and HTTP surfaces.
//
// Tokens are compared as SHA-256 digests in constant time, so neither the
// comparison's timing nor a memory dump of the configuration reveals them,
// and they never reach a log line.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// MinTokenLength is the shortest secret any Conclave service accepts as a
// configured token: 16 characters, so that no one configures a password
// a guesser could find.
const MinTokenLength = 16

// CheckTokens returns an error naming env when one of tokens is empty or
// shorter than MinTokenLength. It gives the entry's position, never the
// token: the error reaches logs.
func CheckTokens(env string, tokens ...string) error {
	for i, t := range tokens {
		if len(t) < MinTokenLength {
			return fmt.Errorf("%s: entry %d is %s; every token must be at least %d characters", env, i+1, tokenLength(t), MinTokenLength)
		}
	}
	return nil
}

func tokenLength(t string) string {
	if t == "" {
		return "empty"
	}
	return fmt.Sprintf("%d characters long", len(t))
}

// Tokens is a set of accepted bearer tokens.
type Tokens struct {
	digests  [][sha256.Size]byte
	throttle *Throttle
}

// NewTokens accepts the given tokens; empty strings are ignored.
func NewTokens(tokens ...string) *Tokens {
	t := &Tokens{}
	for _, tok := range tokens {
		if tok != "" {
			t.digests = append(t.digests, sha256.Sum256([]byte(tok)))
		}
	}
	return t
}

// WithThrottle makes Protect refuse callers whose address presented too
// many wrong tokens (see Throttle), and returns t.
func (t *Tokens) WithThrottle(th *Throttle) *Tokens {
	t.throttle = th
	return t
}

// Empty reports whether no token is accepted.
func (t *Tokens) Empty() bool { return len(t.digests) == 0 }

// Valid reports whether token is one of the set. Every digest is compared,
// so the time taken does not depend on which one matched.
func (t *Tokens) Valid(token string) bool {
	d := sha256.Sum256([]byte(token))
	ok := 0
	for _, want := range t.digests {
		ok |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return ok == 1 && token != ""
}

// Bearer extracts the token from an "authorization: Bearer <token>" value.
func Bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// FromIncomingContext returns the bearer token of a gRPC request.
func FromIncomingContext(ctx context.Context) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if tok, ok := Bearer(v); ok {
			return tok, true
		}
	}
	return "", false
}

// Check returns nil when ctx carries a valid token, or an Unauthenticated
// status saying what is wrong.
func (t *Tokens) Check(ctx context.Context) error {
	tok, ok := FromIncomingContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, `missing "authorization: Bearer <token>" metadata`)
	}
	if !t.Valid(tok) {
		return status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return nil
}

// Protect returns interceptors requiring a valid token on every method whose
// full name starts with one of prefixes (e.g. "/conclave.gateway.v1.").
func (t *Tokens) Protect(prefixes ...string) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	guarded := func(method string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(method, p) {
				return true
			}
		}
		return false
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if guarded(info.FullMethod) {
			if err := t.throttle.GRPC(ctx, t.Check); err != nil {
				return nil, err
			}
			ctx = withClientID(ctx)
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if guarded(info.FullMethod) {
			if err := t.throttle.GRPC(ss.Context(), t.Check); err != nil {
				return err
			}
			ss = identifiedStream{ServerStream: ss, ctx: withClientID(ss.Context())}
		}
		return h(srv, ss)
	}
	return unary, stream
}

// Anonymous is the ClientID of every request whose token was not checked:
// all of them, on a server that accepts requests without a token.
const Anonymous = "anonymous"

// TokenID names the holder of token without revealing it: "token:" and the
// first 16 hex digits of its SHA-256. It is safe to log and to store.
func TokenID(token string) string {
	d := sha256.Sum256([]byte(token))
	return "token:" + hex.EncodeToString(d[:8])
}

type clientIDKey struct{}

func withClientID(ctx context.Context) context.Context {
	tok, _ := FromIncomingContext(ctx)
	return context.WithValue(ctx, clientIDKey{}, TokenID(tok))
}

// ClientID names the caller of a request, for per-client limits and
// records: the TokenID of the bearer token Protect accepted, or Anonymous
// when Protect did not check the request. A token that was not checked
// never becomes an identity, so there are only as many identities as
// accepted tokens, plus Anonymous.
func ClientID(ctx context.Context) string {
	if id, ok := ctx.Value(clientIDKey{}).(string); ok {
		return id
	}
	return Anonymous
}

// identifiedStream carries the ClientID in the stream's context.
type identifiedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s identifiedStream) Context() context.Context { return s.ctx }
