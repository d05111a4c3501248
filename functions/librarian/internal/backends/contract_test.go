package backends_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/functions/librarian/internal/ratelimit"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

var dynalite *testenv.Component

func TestMain(m *testing.M) { os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite)) }

var prefixSeq atomic.Int64

var tables = []store.Table{requests.Table, graph.Table, ratelimit.Table, access.Table}

// contract runs fn against the embedded store and against dynalite, each
// with fresh tables.
func contract(t *testing.T, fn func(t *testing.T, st store.Store)) {
	t.Helper()
	t.Parallel()
	open := map[string]func(t *testing.T) store.Store{
		"embedded": func(t *testing.T) store.Store {
			s, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}
	if dynalite != nil {
		open["dynamodb"] = func(*testing.T) store.Store {
			return store.NewDynamo(testenv.DynamoDBClient(dynalite.Endpoint), store.DynamoOptions{
				TablePrefix: fmt.Sprintf("lib%d-", prefixSeq.Add(1)), Endpoint: dynalite.Endpoint})
		}
	} else if !testing.Short() {
		t.Fatal("dynalite did not start")
	}
	for name, o := range open {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := o(t)
			if err := store.EnsureTables(context.Background(), st, tables...); err != nil {
				t.Fatal(err)
			}
			fn(t, st)
		})
	}
}

func TestRequestsLifecycle(t *testing.T) {
	contract(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		rs := requests.New(st, nil)
		id := requests.NewID()
		if !requests.ValidID(id) || requests.ValidID("req-../../x") {
			t.Fatalf("ValidID misjudges %q", id)
		}
		req := &librarianv1.AgentRequest{AgentId: "claude-3", RequestType: "APPROVAL", Content: "# x", TargetPath: proto.String("docs/x.md")}
		rec, err := rs.Create(ctx, requests.Record{ID: id, AgentID: "claude-3", State: governance.Escalated, Request: req,
			Response: &librarianv1.LibrarianResponse{RequestId: id, Status: "escalated"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rs.Create(ctx, rec); !errors.Is(err, store.ErrConditionFailed) {
			t.Fatalf("second create: %v", err)
		}
		owner, found, err := rs.Owner(ctx, id)
		if err != nil || !found || owner != "claude-3" {
			t.Fatalf("owner %q %v %v", owner, found, err)
		}
		if _, found, _ := rs.Owner(ctx, requests.NewID()); found {
			t.Fatal("an unknown request has an owner")
		}
		listed, err := rs.List(ctx, governance.Escalated, 10)
		if err != nil || len(listed) != 1 || listed[0].ID != id || listed[0].Request.GetTargetPath() != "docs/x.md" {
			t.Fatalf("list: %v %v", listed, err)
		}
		// Concurrent decisions: exactly one wins, the others see an illegal
		// transition.
		var wins, illegal atomic.Int32
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				_, err := rs.Update(ctx, id, func(r *requests.Record) error {
					to := governance.Approved
					if i%2 == 1 {
						to = governance.Rejected
					}
					if err := governance.Transition(r.State, to); err != nil {
						return err
					}
					r.State = to
					return nil
				})
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, governance.ErrIllegalTransition):
					illegal.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 || illegal.Load() != 5 {
			t.Fatalf("%d wins, %d illegal", wins.Load(), illegal.Load())
		}
		if listed, _ := rs.List(ctx, governance.Escalated, 10); len(listed) != 0 {
			t.Fatalf("a decided request is still listed: %v", listed)
		}
		got, err := rs.Get(ctx, id)
		if err != nil || got.State == governance.Escalated || got.Response.GetStatus() != "escalated" || !got.UpdatedAt.After(got.CreatedAt.Add(-time.Second)) {
			t.Fatalf("get: %+v %v", got, err)
		}
		if _, err := rs.Get(ctx, "req-nope"); !errors.Is(err, requests.ErrNotFound) {
			t.Fatalf("get of a malformed id: %v", err)
		}
	})
}

func TestGraph(t *testing.T) {
	contract(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		g := graph.New(st)
		nodes, err := graph.LoadDir(fstest.MapFS{
			"architecture/overview.md": {Data: []byte("---\nid: arch-001\nreferences: [req-045]\n---\n# Architecture overview\n\nAuthentication uses OAuth tokens.\n")},
			"requirements.md":          {Data: []byte("---\nid: req-045\n---\n# Requirements\n\nUsers sign in.\n")},
			"design/login.md":          {Data: []byte("# Login design\n\nThe login page asks for authentication with a password and authentication codes.\n")},
			"tests/login_test.md":      {Data: []byte("no heading here")},
			"notes.txt":                {Data: []byte("ignored")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 4 {
			t.Fatalf("%d nodes from the seed directory", len(nodes))
		}
		for _, n := range nodes {
			if err := g.Put(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		loginID := governance.AssignID("design", "design/login.md")
		missing, err := g.Missing(ctx, []string{"arch-001", "nope", loginID})
		if err != nil || !slices.Equal(missing, []string{"nope"}) {
			t.Fatalf("missing %v %v", missing, err)
		}
		if id, err := g.Resolve(ctx, "", "design/login.md"); err != nil || id != loginID {
			t.Fatalf("resolve by path: %q %v", id, err)
		}
		if id, _ := g.Resolve(ctx, "arch-001", ""); id != "arch-001" {
			t.Fatalf("resolve by id: %q", id)
		}
		if id, _ := g.Resolve(ctx, "nope", "nowhere.md"); id != "" {
			t.Fatalf("resolve of nothing: %q", id)
		}
		// req-045 → arch-001 would close arch-001 → req-045.
		cycle, err := g.Cycle(ctx, "req-045", []string{"arch-001"})
		if err != nil || !slices.Equal(cycle, []string{"req-045", "arch-001", "req-045"}) {
			t.Fatalf("cycle %v %v", cycle, err)
		}
		if cycle, _ := g.Cycle(ctx, loginID, []string{"arch-001"}); cycle != nil {
			t.Fatalf("a cycle that is not: %v", cycle)
		}
		ranked, err := g.Search(ctx, "How does authentication work?", nil, 5)
		if err != nil || len(ranked) != 2 || ranked[0].Node.ID != loginID || ranked[1].Node.ID != "arch-001" {
			t.Fatalf("search: %+v %v", ranked, err)
		}
		if only, _ := g.Search(ctx, "authentication", []string{"architecture"}, 5); len(only) != 1 || only[0].Node.ID != "arch-001" {
			t.Fatalf("search by type: %+v", only)
		}
		// Moving a node frees its old path; deleting frees the new one.
		n, _ := g.Get(ctx, loginID)
		n.Path = "design/sign-in.md"
		if err := g.Put(ctx, n); err != nil {
			t.Fatal(err)
		}
		if id, _ := g.Resolve(ctx, "", "design/login.md"); id != "" {
			t.Fatalf("old path still resolves to %q", id)
		}
		if err := g.Delete(ctx, loginID); err != nil {
			t.Fatal(err)
		}
		if id, _ := g.Resolve(ctx, "", "design/sign-in.md"); id != "" {
			t.Fatalf("deleted node's path resolves to %q", id)
		}
	})
}

func TestRateLimitsHoldAcrossInstances(t *testing.T) {
	contract(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		// Tomorrow, as the store judges the counters' expiry by its own
		// clock.
		hour := time.Now().UTC().Add(24 * time.Hour).Truncate(time.Hour)
		now := hour.Add(30 * time.Second)
		clock := func() time.Time { return now }
		agent := policy.Agent{ID: "claude-3", RateLimit: policy.Rate{Count: 100, Window: time.Hour}}
		// Two limiters are two Lambda instances sharing the table.
		instances := []*ratelimit.Limiter{ratelimit.New(st, ratelimit.APIRate, clock), ratelimit.New(st, ratelimit.APIRate, clock)}
		var allowed atomic.Int32
		var wg sync.WaitGroup
		for i := range 80 {
			wg.Go(func() {
				all, err := instances[i%2].Take(ctx, agent)
				if err != nil {
					t.Error(err)
					return
				}
				if all[0].Allowed && all[1].Allowed {
					allowed.Add(1)
				}
			})
		}
		wg.Wait()
		if allowed.Load() != 60 {
			t.Fatalf("%d of 80 requests in a minute allowed, want 60", allowed.Load())
		}
		all, _ := instances[0].Take(ctx, agent)
		if all[0].Allowed || all[0].Remaining != 0 || !all[0].Reset.Equal(hour.Add(time.Minute)) || all[1].Remaining != 100-81 {
			t.Fatalf("allowances %+v", all)
		}
		// The next minute the API limit has room, and the hourly one is
		// what stops the agent once it has made 100.
		now = now.Add(time.Minute)
		for range 19 {
			if all, _ := instances[1].Take(ctx, agent); !all[0].Allowed || !all[1].Allowed {
				t.Fatalf("refused within both limits: %+v", all)
			}
		}
		all, _ = instances[1].Take(ctx, agent)
		if !all[0].Allowed || all[1].Allowed || all[1].Name != "agent" || !all[1].Reset.Equal(hour.Add(time.Hour)) {
			t.Fatalf("the registry limit did not hold: %+v", all)
		}
		// Another agent has its own counters.
		if all, _ := instances[0].Take(ctx, policy.Agent{ID: "copilot-2", RateLimit: agent.RateLimit}); !all[0].Allowed || !all[1].Allowed {
			t.Fatalf("copilot-2 limited by claude-3's requests: %+v", all)
		}
	})
}

func TestTokens(t *testing.T) {
	contract(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		tokens := access.New(st)
		tok, id, err := tokens.Create(ctx, "claude-3", access.RoleAgent)
		if err != nil {
			t.Fatal(err)
		}
		if access.TokenID(tok) != id {
			t.Fatalf("TokenID(%q) != %q", tok, id)
		}
		p, err := tokens.Verify(ctx, tok)
		if err != nil || p.Subject != "claude-3" || p.Role != access.RoleAgent || p.TokenID != id {
			t.Fatalf("verify: %+v %v", p, err)
		}
		forged := tok[:len(tok)-1] + "A"
		if forged == tok {
			forged = tok[:len(tok)-1] + "B"
		}
		for _, bad := range []string{"", "lib_", "Bearer x", forged, "lib_0000000000000000_" + tok[len(tok)-43:]} {
			if _, err := tokens.Verify(ctx, bad); !errors.Is(err, access.ErrUnauthenticated) {
				t.Fatalf("verify(%q): %v", bad, err)
			}
		}
		if err := tokens.Revoke(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := tokens.Verify(ctx, tok); !errors.Is(err, access.ErrUnauthenticated) {
			t.Fatalf("a revoked token verified: %v", err)
		}
		if err := tokens.Revoke(ctx, "0000000000000000"); err == nil {
			t.Fatal("revoked a token that does not exist")
		}
		if _, _, err := tokens.Create(ctx, "../x", access.RoleAgent); err == nil {
			t.Fatal("issued a token for a malformed subject")
		}
	})
}

func TestStaticTokens(t *testing.T) {
	t.Parallel()
	var s access.Static
	if err := access.ParseStatic([]string{"alice=alice-reviewer-secret"}, access.RoleReviewer, &s); err != nil {
		t.Fatal(err)
	}
	if err := access.ParseStatic([]string{"bob=short"}, access.RoleReviewer, &s); err == nil {
		t.Fatal("accepted a short token")
	}
	if p, ok := s.Verify("alice-reviewer-secret"); !ok || p.Subject != "alice" || p.Role != access.RoleReviewer {
		t.Fatalf("verify: %+v %v", p, ok)
	}
	if _, ok := s.Verify("alice-reviewer-secreT"); ok {
		t.Fatal("a wrong token verified")
	}
}
