package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// dynalite is the real DynamoDB-compatible server the DynamoDB backend is
// tested against; nil under -short.
var dynalite *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite))
}

// clock is a test clock both backends judge expiry by.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

type backend struct {
	name string
	open func(t *testing.T, c *clock) store.Store
}

var tableSeq atomic.Int64

func backends(t *testing.T) []backend {
	bs := []backend{{"embedded", func(t *testing.T, c *clock) store.Store {
		s, err := store.OpenBolt(filepath.Join(t.TempDir(), "store.db"), store.BoltOptions{Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}}
	if dynalite != nil {
		bs = append(bs, backend{"dynamodb", func(t *testing.T, c *clock) store.Store {
			prefix := fmt.Sprintf("t%d-", tableSeq.Add(1))
			return store.NewDynamo(testenv.DynamoDBClient(dynalite.Endpoint), store.DynamoOptions{
				TablePrefix: prefix, Endpoint: dynalite.Endpoint, Now: c.Now,
			})
		}})
	} else if !testing.Short() {
		t.Fatal("dynalite not started")
	}
	return bs
}

// contract runs fn against every backend, each with a fresh table "items".
func contract(t *testing.T, fn func(t *testing.T, s store.Store, c *clock)) {
	t.Helper()
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			s := b.open(t, c)
			if err := s.EnsureTable(context.Background(), store.Table{Name: "items"}); err != nil {
				t.Fatal(err)
			}
			fn(t, s, c)
		})
	}
}

var ctx = context.Background()

func key(pk, sk string) store.Key { return store.Key{PK: pk, SK: sk} }

func TestPutGetDelete(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		it := store.Item{Key: key("p", "a"), Data: []byte("hello"), Attrs: map[string]string{"owner": "gw-1"}}
		put, err := s.Put(ctx, "items", it)
		if err != nil || put.Version != 1 {
			t.Fatalf("put: %v version %d", err, put.Version)
		}
		got, err := s.Get(ctx, "items", it.Key)
		if err != nil || !bytes.Equal(got.Data, it.Data) || got.Attrs["owner"] != "gw-1" || got.Version != 1 {
			t.Fatalf("get = %+v, %v", got, err)
		}
		it.Data = []byte("again")
		if put, err = s.Put(ctx, "items", it); err != nil || put.Version != 2 {
			t.Fatalf("second put: %v version %d", err, put.Version)
		}
		if err := s.Delete(ctx, "items", it.Key); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "items", it.Key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if err := s.Delete(ctx, "items", it.Key); err != nil {
			t.Fatalf("deleting a missing item: %v", err)
		}
	})
}

func TestConditions(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		base := store.Item{Key: key("p", "k"), Attrs: map[string]string{"state": "idle"}}
		if _, err := s.Put(ctx, "items", base, store.IfNotExists()); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name  string
			conds []store.Condition
			ok    bool
		}{
			{"not exists on existing", []store.Condition{store.IfNotExists()}, false},
			{"exists", []store.Condition{store.IfExists()}, true},
			{"version matches", []store.Condition{store.IfVersion(2)}, true},
			{"version stale", []store.Condition{store.IfVersion(1)}, false},
			{"attr matches", []store.Condition{store.IfAttrEquals("state", "idle")}, true},
			{"attr differs", []store.Condition{store.IfAttrEquals("state", "busy")}, false},
			{"attr missing", []store.Condition{store.IfAttrEquals("other", "idle")}, false},
			{"all hold", []store.Condition{store.IfExists(), store.IfVersion(4), store.IfAttrEquals("state", "idle")}, true},
			{"one fails", []store.Condition{store.IfExists(), store.IfVersion(99)}, false},
		}
		for _, tt := range tests { // sequential: each success bumps the version
			_, err := s.Put(ctx, "items", base, tt.conds...)
			if tt.ok && err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			if !tt.ok && !errors.Is(err, store.ErrConditionFailed) {
				t.Errorf("%s: err = %v, want ErrConditionFailed", tt.name, err)
			}
		}
		if err := s.Delete(ctx, "items", base.Key, store.IfVersion(1)); !errors.Is(err, store.ErrConditionFailed) {
			t.Errorf("conditional delete with a stale version: %v", err)
		}
		if err := s.Delete(ctx, "items", base.Key, store.IfAttrEquals("state", "idle")); err != nil {
			t.Errorf("conditional delete: %v", err)
		}
		if _, err := s.Put(ctx, "items", base, store.IfExists()); !errors.Is(err, store.ErrConditionFailed) {
			t.Errorf("IfExists on a missing item: %v", err)
		}
	})
}

func TestConcurrentCreateHasOneWinner(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		const writers = 16
		for round := range 5 {
			var wins atomic.Int32
			var wg sync.WaitGroup
			k := key("lease", fmt.Sprint(round))
			for w := range writers {
				wg.Go(func() {
					_, err := s.Put(ctx, "items", store.Item{Key: k, Attrs: map[string]string{"owner": fmt.Sprint(w)}}, store.IfNotExists())
					switch {
					case err == nil:
						wins.Add(1)
					case !errors.Is(err, store.ErrConditionFailed):
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if n := wins.Load(); n != 1 {
				t.Fatalf("round %d: %d writers won, want exactly 1", round, n)
			}
		}
	})
}

func TestConcurrentCompareAndSwap(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		k := key("cas", "x")
		if _, err := s.Put(ctx, "items", store.Item{Key: k, Data: []byte("0")}); err != nil {
			t.Fatal(err)
		}
		const writers, each = 8, 10
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				for range each {
					for {
						cur, err := s.Get(ctx, "items", k)
						if err != nil {
							t.Error(err)
							return
						}
						var n int
						fmt.Sscan(string(cur.Data), &n)
						_, err = s.Put(ctx, "items", store.Item{Key: k, Data: []byte(fmt.Sprint(n + 1))}, store.IfVersion(cur.Version))
						if err == nil {
							break
						}
						if !errors.Is(err, store.ErrConditionFailed) {
							t.Error(err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		got, err := s.Get(ctx, "items", k)
		if err != nil || string(got.Data) != fmt.Sprint(writers*each) || got.Version != writers*each+1 {
			t.Fatalf("after %d increments: data %q version %d, %v", writers*each, got.Data, got.Version, err)
		}
	})
}

func TestTTL(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		exp := c.Now().Add(time.Minute)
		for _, sk := range []string{"a", "b"} {
			if _, err := s.Put(ctx, "items", store.Item{Key: key("ttl", sk), ExpiresAt: exp}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Put(ctx, "items", store.Item{Key: key("ttl", "forever")}); err != nil {
			t.Fatal(err)
		}
		if n, err := s.Add(ctx, "items", key("ttl", "counter"), 5, exp); err != nil || n != 5 {
			t.Fatalf("add = %d, %v", n, err)
		}
		got, err := s.Get(ctx, "items", key("ttl", "a"))
		if err != nil || !got.ExpiresAt.Equal(exp) {
			t.Fatalf("before expiry: %+v, %v", got, err)
		}

		c.Advance(time.Minute) // expiry is exclusive: at ExpiresAt the item is gone
		if _, err := s.Get(ctx, "items", key("ttl", "a")); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("expired item still readable: %v", err)
		}
		page, err := s.Query(ctx, "items", store.Query{PK: "ttl"})
		if err != nil || len(page.Items) != 1 || page.Items[0].SK != "forever" {
			t.Errorf("query after expiry = %+v, %v", page.Items, err)
		}
		items, err := s.BatchGet(ctx, "items", []store.Key{key("ttl", "a"), key("ttl", "forever")})
		if err != nil || len(items) != 1 {
			t.Errorf("batch get after expiry = %d items, %v", len(items), err)
		}
		// An expired item counts as absent for conditions and restarts
		// its version and counter.
		put, err := s.Put(ctx, "items", store.Item{Key: key("ttl", "b")}, store.IfNotExists())
		if err != nil || put.Version != 1 {
			t.Errorf("IfNotExists over an expired item: %v, version %d", err, put.Version)
		}
		if err := s.Delete(ctx, "items", key("ttl", "a"), store.IfExists()); !errors.Is(err, store.ErrConditionFailed) {
			t.Errorf("IfExists on an expired item: %v", err)
		}
		if n, err := s.Add(ctx, "items", key("ttl", "counter"), 2, time.Time{}); err != nil || n != 2 {
			t.Errorf("counter after expiry = %d, %v; want a fresh 2", n, err)
		}
	})
}

func TestCountersUnderContention(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		const workers, each = 8, 40
		exp := c.Now().Add(time.Hour)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range each {
					if _, err := s.Add(ctx, "items", key("rate", "agent-1"), 1, exp); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		n, err := s.Add(ctx, "items", key("rate", "agent-1"), 0, exp)
		if err != nil || n != workers*each {
			t.Fatalf("counter = %d, %v; want %d", n, err, workers*each)
		}
		got, err := s.Get(ctx, "items", key("rate", "agent-1"))
		if err != nil || got.Counter != workers*each || !got.ExpiresAt.Equal(exp) {
			t.Fatalf("counter item = %+v, %v", got, err)
		}
		if n, err := s.Add(ctx, "items", key("rate", "agent-1"), -10, time.Time{}); err != nil || n != workers*each-10 {
			t.Fatalf("negative delta: %d, %v", n, err)
		}
	})
}

func TestQueryPagination(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		const total = 1234
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range total {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				sk := fmt.Sprintf("msg#%05d", i)
				if _, err := s.Put(ctx, "items", store.Item{Key: key("thread", sk)}); err != nil {
					t.Error(err)
				}
			})
		}
		// Neighbouring partitions must not leak into the query.
		for _, pk := range []string{"thread2", "threa", "thread\x00"} {
			if _, err := s.Put(ctx, "items", store.Item{Key: key(pk, "msg#00000")}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Put(ctx, "items", store.Item{Key: key("thread", "other")}); err != nil {
			t.Fatal(err)
		}
		wg.Wait()

		for _, reverse := range []bool{false, true} {
			var got []string
			cursor := ""
			pages := 0
			for {
				page, err := s.Query(ctx, "items", store.Query{PK: "thread", Prefix: "msg#", Limit: 100, Cursor: cursor, Reverse: reverse})
				if err != nil {
					t.Fatal(err)
				}
				pages++
				for _, it := range page.Items {
					got = append(got, it.SK)
				}
				if page.Cursor == "" {
					break
				}
				cursor = page.Cursor
			}
			if len(got) != total || pages != 13 {
				t.Fatalf("reverse=%v: %d items in %d pages, want %d in 13", reverse, len(got), pages, total)
			}
			for i, sk := range got {
				want := i
				if reverse {
					want = total - 1 - i
				}
				if sk != fmt.Sprintf("msg#%05d", want) {
					t.Fatalf("reverse=%v: item %d is %s", reverse, i, sk)
				}
			}
		}

		tests := []struct {
			name  string
			q     store.Query
			first string
			n     int
		}{
			{"range", store.Query{PK: "thread", From: "msg#00100", To: "msg#00199", Limit: 1000}, "msg#00100", 100},
			{"range reverse", store.Query{PK: "thread", From: "msg#00100", To: "msg#00199", Limit: 1000, Reverse: true}, "msg#00199", 100},
			{"from only", store.Query{PK: "thread", From: "msg#01200", Limit: 1000}, "msg#01200", 35},
			{"to only reverse", store.Query{PK: "thread", To: "msg#00009", Limit: 1000, Reverse: true}, "msg#00009", 10},
			{"prefix", store.Query{PK: "thread", Prefix: "msg#0123", Limit: 1000}, "msg#01230", 4},
			{"prefix reverse", store.Query{PK: "thread", Prefix: "msg#0123", Limit: 1000, Reverse: true}, "msg#01233", 4},
			{"whole partition", store.Query{PK: "thread", Limit: 1000, Reverse: true}, "other", 1000},
			{"no match", store.Query{PK: "thread", Prefix: "zzz"}, "", 0},
		}
		for _, tt := range tests {
			page, err := s.Query(ctx, "items", tt.q)
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
				continue
			}
			if len(page.Items) != tt.n || (tt.n > 0 && page.Items[0].SK != tt.first) {
				first := ""
				if len(page.Items) > 0 {
					first = page.Items[0].SK
				}
				t.Errorf("%s: %d items starting %q, want %d starting %q", tt.name, len(page.Items), first, tt.n, tt.first)
			}
		}
	})
}

func TestBatchGet(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		var keys []store.Key
		for i := range 250 {
			k := key("b", fmt.Sprintf("%03d", i))
			keys = append(keys, k)
			if i%5 == 0 {
				continue // left missing
			}
			if _, err := s.Put(ctx, "items", store.Item{Key: k, Data: []byte(k.SK)}); err != nil {
				t.Fatal(err)
			}
		}
		keys = append(keys, keys[1]) // a duplicate key is answered once
		items, err := s.BatchGet(ctx, "items", keys)
		if err != nil {
			t.Fatal(err)
		}
		if len(items) != 200 {
			t.Fatalf("got %d items, want 200", len(items))
		}
		for i := 1; i < len(items); i++ {
			if items[i-1].SK >= items[i].SK || string(items[i].Data) != items[i].SK {
				t.Fatalf("items out of key order or wrong at %d: %s %s", i, items[i-1].SK, items[i].SK)
			}
		}
	})
}

func TestInvalidRequests(t *testing.T) {
	contract(t, func(t *testing.T, s store.Store, c *clock) {
		big := store.Item{Key: key("p", "big"), Data: make([]byte, store.MaxItemBytes)}
		// Sent to a table that does not exist: a request would have said
		// "table not found", so ErrItemTooLarge proves none was sent.
		if _, err := s.Put(ctx, "missing", big); !errors.Is(err, store.ErrItemTooLarge) {
			t.Errorf("oversized item: %v", err)
		}
		_, err := s.Get(ctx, "missing", key("p", "a"))
		if !errors.Is(err, store.ErrTableNotFound) || !strings.Contains(err.Error(), "missing") {
			t.Errorf("missing table: %v", err)
		}
		page, err := s.Query(ctx, "items", store.Query{PK: "p", Limit: 1})
		if err != nil || page.Cursor != "" {
			t.Fatalf("empty query: %v", err)
		}
		if _, err := s.Put(ctx, "items", store.Item{Key: key("p", "1")}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(ctx, "items", store.Item{Key: key("p", "2")}); err != nil {
			t.Fatal(err)
		}
		page, err = s.Query(ctx, "items", store.Query{PK: "p", Limit: 1})
		if err != nil || page.Cursor == "" {
			t.Fatalf("want a cursor: %+v %v", page, err)
		}
		bad := []struct {
			name string
			err  error
		}{
			{"empty pk", func() error { _, err := s.Get(ctx, "items", key("", "a")); return err }()},
			{"empty sk", func() error { _, err := s.Put(ctx, "items", store.Item{Key: key("p", "")}); return err }()},
			{"not utf-8", func() error { _, err := s.Get(ctx, "items", key("p", "\xff")); return err }()},
			{"bad attr name", func() error {
				_, err := s.Put(ctx, "items", store.Item{Key: key("p", "a"), Attrs: map[string]string{"a b": "x"}})
				return err
			}()},
			{"garbage cursor", func() error { _, err := s.Query(ctx, "items", store.Query{PK: "p", Cursor: "!!!"}); return err }()},
			{"cursor of another partition", func() error { _, err := s.Query(ctx, "items", store.Query{PK: "q", Cursor: page.Cursor}); return err }()},
			{"prefix and range", func() error {
				_, err := s.Query(ctx, "items", store.Query{PK: "p", Prefix: "a", From: "b"})
				return err
			}()},
			{"limit too big", func() error { _, err := s.Query(ctx, "items", store.Query{PK: "p", Limit: 5000}); return err }()},
		}
		for _, b := range bad {
			if !errors.Is(b.err, store.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", b.name, b.err)
			}
		}
	})
}

func TestEmbeddedSurvivesRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "store.db")
	s, err := store.OpenBolt(path, store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureTable(ctx, store.Table{Name: "items"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "items", store.Item{Key: key("p", "a"), Data: []byte("kept"), Attrs: map[string]string{"x": "y"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(ctx, "items", key("p", "n"), 7, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = store.OpenBolt(path, store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, "items", key("p", "a"))
	if err != nil || string(got.Data) != "kept" || got.Attrs["x"] != "y" {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
	if n, err := s.Add(ctx, "items", key("p", "n"), 1, time.Time{}); err != nil || n != 8 {
		t.Fatalf("counter after restart: %d, %v", n, err)
	}
}

func TestEmbeddedSweep(t *testing.T) {
	t.Parallel()
	c := newClock()
	s, err := store.OpenBolt(filepath.Join(t.TempDir(), "store.db"), store.BoltOptions{Now: c.Now, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.EnsureTable(ctx, store.Table{Name: "items"}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		exp := time.Time{}
		if i%2 == 0 {
			exp = c.Now().Add(time.Second)
		}
		if _, err := s.Put(ctx, "items", store.Item{Key: key("p", fmt.Sprint(i)), ExpiresAt: exp}); err != nil {
			t.Fatal(err)
		}
	}
	c.Advance(time.Hour)
	if n, err := s.Sweep(); err != nil || n != 5 {
		t.Fatalf("swept %d, %v; want 5", n, err)
	}
	page, err := s.Query(ctx, "items", store.Query{PK: "p"})
	if err != nil || len(page.Items) != 5 {
		t.Fatalf("%d left, %v", len(page.Items), err)
	}
}

func TestDynamoUnreachableNamesEndpoint(t *testing.T) {
	t.Parallel()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	s := store.NewDynamo(testenv.DynamoDBClient(endpoint), store.DynamoOptions{Endpoint: endpoint})
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = s.Get(cctx, "items", key("p", "a"))
	if err == nil || !strings.Contains(err.Error(), endpoint) || !strings.Contains(err.Error(), "items") {
		t.Fatalf("err = %v, want one naming %s and the table", err, endpoint)
	}
}

func TestDynamoTablesMatchDefinition(t *testing.T) {
	if testing.Short() {
		t.Skip("needs dynalite")
	}
	t.Parallel()
	client := testenv.DynamoDBClient(dynalite.Endpoint)
	s := store.NewDynamo(client, store.DynamoOptions{TablePrefix: "def-", Endpoint: dynalite.Endpoint})
	for range 2 { // idempotent
		if err := s.EnsureTable(ctx, store.Table{Name: "agents"}); err != nil {
			t.Fatal(err)
		}
	}
	out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String("def-agents")})
	if err != nil {
		t.Fatal(err)
	}
	var schema []string
	for _, k := range out.Table.KeySchema {
		schema = append(schema, aws.ToString(k.AttributeName)+":"+string(k.KeyType))
	}
	if got := strings.Join(schema, ","); !regexp.MustCompile(`^pk:HASH,sk:RANGE$`).MatchString(got) {
		t.Fatalf("key schema = %s", got)
	}
}
