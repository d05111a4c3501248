package clientapi

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/store"
)

func TestValidateIdempotencyKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		key  string
		ok   bool
	}{
		{"uuid", "3f2b1c9e-7d4a-4e8b-9a61-0c5d2e7f8a90", true},
		{"128 bytes", strings.Repeat("k", 128), true},
		{"spaces and unicode", "order 42 — retry", true},
		{"129 bytes", strings.Repeat("k", 129), false},
		{"128 bytes of 2-byte runes plus one", strings.Repeat("é", 64) + "x", false},
		{"newline", "a\nb", false},
		{"NUL", "a\x00b", false},
		{"DEL", "a\x7fb", false},
		{"C1 control", "a\u0085b", false},
	}
	for _, tt := range tests {
		err := validateIdempotencyKey(tt.key)
		if tt.ok && err != nil {
			t.Errorf("%s: %v, want accepted", tt.name, err)
		}
		if !tt.ok && status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", tt.name, err)
		}
	}
}

// testIdempotency runs over a real embedded store whose clock the test
// moves.
func testIdempotency(t *testing.T) (*idempotency, *atomic.Int64) {
	t.Helper()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{Now: now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := store.EnsureTables(context.Background(), st, IdempotencyTable); err != nil {
		t.Fatal(err)
	}
	return &idempotency{store: st, ttl: time.Hour, now: now}, &clock
}

// asClient is a request context as auth.Protect leaves it for token.
func asClient(t *testing.T, token string) context.Context {
	t.Helper()
	unary, _ := auth.NewTokens(token).Protect("/")
	var ctx context.Context
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
	if _, err := unary(in, nil, &grpc.UnaryServerInfo{FullMethod: "/svc/Method"}, func(c context.Context, _ any) (any, error) { ctx = c; return nil, nil }); err != nil {
		t.Fatal(err)
	}
	return ctx
}

func TestClaimScopes(t *testing.T) {
	t.Parallel()
	idem, _ := testIdempotency(t)
	alice, bob := asClient(t, "alice"), asClient(t, "bob")
	first, _, err := idem.claim(alice, "agent-1", "k", "gw.1", "", "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		ctx          context.Context
		agent, key   string
		want         codes.Code
		wantHolderID string
	}{
		{"same client, agent and key", alice, "agent-1", "k", codes.AlreadyExists, "gw.1"},
		{"another client", bob, "agent-1", "k", codes.OK, ""},
		{"another agent", alice, "agent-2", "k", codes.OK, ""},
		{"another key", alice, "agent-1", "k2", codes.OK, ""},
		// The digest separates agent and key, so these do not collide.
		{"agent and key split elsewhere", alice, "agent-1k", "", codes.OK, ""},
		{"anonymous", context.Background(), "agent-1", "k", codes.OK, ""},
	}
	for i, tt := range tests {
		_, _, err := idem.claim(tt.ctx, tt.agent, tt.key, "gw.other"+string(rune('a'+i)), "", "")
		if status.Code(err) != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
			continue
		}
		if tt.want != codes.AlreadyExists {
			continue
		}
		st := status.Convert(err)
		if !strings.Contains(st.Message(), "as request "+tt.wantHolderID) || !strings.Contains(st.Message(), `"agent-1"`) {
			t.Errorf("%s: message %q does not name the request and agent", tt.name, st.Message())
		}
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if e, ok := d.(*errdetails.ErrorInfo); ok {
				info = e
			}
		}
		if info == nil || info.GetReason() != IdempotencyReason || info.GetMetadata()["request_id"] != tt.wantHolderID {
			t.Errorf("%s: details %v, want ErrorInfo with request_id %s", tt.name, st.Details(), tt.wantHolderID)
		}
	}
	it, err := idem.store.Get(context.Background(), IdempotencyTable.Name, first.key)
	if err != nil || it.PK != auth.TokenID("alice") || len(it.SK) != 64 || it.Attrs["agent_id"] != "agent-1" || it.Attrs["request_id"] != "gw.1" {
		t.Fatalf("stored claim %+v, %v", it, err)
	}
	if strings.Contains(it.PK+it.SK, "alice") {
		t.Fatalf("the token is in the store key: %+v", it.Key)
	}
}

func TestClaimReleaseAndExpiry(t *testing.T) {
	t.Parallel()
	idem, clock := testIdempotency(t)
	ctx := asClient(t, "alice")
	c, _, err := idem.claim(ctx, "agent", "k", "gw.1", "", "")
	if err != nil {
		t.Fatal(err)
	}
	// A release only gives back the claim it made: once the key was
	// claimed again by another request, the old release leaves it alone.
	if err := c.release(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := idem.claim(ctx, "agent", "k", "gw.2", "", ""); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	if err := c.release(); err != nil {
		t.Fatalf("stale release: %v", err)
	}
	if _, _, err := idem.claim(ctx, "agent", "k", "gw.3", "", ""); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "gw.2") {
		t.Fatalf("a stale release gave back another request's claim: %v", err)
	}
	// An expired claim is no claim.
	clock.Add(int64(idem.ttl + time.Second))
	if _, _, err := idem.claim(ctx, "agent", "k", "gw.4", "", ""); err != nil {
		t.Fatalf("claim after expiry: %v", err)
	}
}

func TestClaimStoreDown(t *testing.T) {
	t.Parallel()
	idem, _ := testIdempotency(t)
	if err := idem.store.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := idem.claim(asClient(t, "alice"), "agent", "k", "gw.1", "", ""); status.Code(err) != codes.Unavailable {
		t.Fatalf("claim on a closed store: %v, want UNAVAILABLE", err)
	}
}
