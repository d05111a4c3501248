// Package store_test measures pkg/store's two backends side by side in one
// run: the embedded bbolt file and DynamoDB's protocol on dynalite.
//
//	go test -run '^$' -bench . -benchmem ./store/
package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

var dynalite *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite))
}

var seq atomic.Int64

func backends(b *testing.B) map[string]store.Store {
	out := map[string]store.Store{}
	bolt, err := store.OpenBolt(filepath.Join(b.TempDir(), "bench.db"), store.BoltOptions{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = bolt.Close() })
	out["embedded"] = bolt
	if dynalite != nil {
		client := testenv.DynamoDBClient(dynalite.Endpoint)
		out["dynamodb"] = store.NewDynamo(client, store.DynamoOptions{TablePrefix: fmt.Sprintf("b%d-", seq.Add(1)), Endpoint: dynalite.Endpoint})
	}
	for name, s := range out {
		if err := s.EnsureTable(context.Background(), store.Table{Name: "bench"}); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
	}
	return out
}

var payload = make([]byte, 512)

func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	for _, name := range []string{"embedded", "dynamodb"} {
		ops := []struct {
			op  string
			run func(b *testing.B, s store.Store)
		}{
			{"put", func(b *testing.B, s store.Store) {
				for i := 0; b.Loop(); i++ {
					if _, err := s.Put(ctx, "bench", store.Item{Key: store.Key{PK: "p", SK: fmt.Sprint(i % 1000)}, Data: payload}); err != nil {
						b.Fatal(err)
					}
				}
			}},
			{"get", func(b *testing.B, s store.Store) {
				k := store.Key{PK: "p", SK: "get"}
				if _, err := s.Put(ctx, "bench", store.Item{Key: k, Data: payload}); err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if _, err := s.Get(ctx, "bench", k); err != nil {
						b.Fatal(err)
					}
				}
			}},
			{"conditional-put", func(b *testing.B, s store.Store) {
				k := store.Key{PK: "p", SK: "cas"}
				it, err := s.Put(ctx, "bench", store.Item{Key: k, Data: payload})
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if it, err = s.Put(ctx, "bench", store.Item{Key: k, Data: payload}, store.IfVersion(it.Version)); err != nil {
						b.Fatal(err)
					}
				}
			}},
		}
		for _, o := range ops {
			b.Run(o.op+"/"+name, func(b *testing.B) {
				s, ok := backends(b)[name]
				if !ok {
					b.Skip("dynalite runs only without -short")
				}
				b.ReportAllocs()
				o.run(b, s)
			})
		}
	}
}
