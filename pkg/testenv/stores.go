package testenv

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/conclave-ai/conclave/pkg/store"
)

var tablePrefixSeq atomic.Int64

// Stores are the two backends a store-backed test runs on, each holding
// tables: the embedded store ("embedded", a file in the test's temporary
// directory) and DynamoDB on dynalite ("dynamodb", tables under a prefix of
// their own), left out when dynalite is nil (-short). They are closed when
// the test ends.
func Stores(t testing.TB, dynalite *Component, tables ...store.Table) map[string]store.Store {
	t.Helper()
	bolt, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.Store{"embedded": bolt}
	if dynalite != nil {
		out["dynamodb"] = store.NewDynamo(DynamoDBClient(dynalite.Endpoint),
			store.DynamoOptions{TablePrefix: fmt.Sprintf("t%d-", tablePrefixSeq.Add(1)), Endpoint: dynalite.Endpoint})
	}
	for name, st := range out {
		t.Cleanup(func() { _ = st.Close() })
		if err := store.EnsureTables(context.Background(), st, tables...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return out
}
