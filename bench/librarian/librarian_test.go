// Package librarian benchmarks the Librarian: warm handler latency per
// request type on the embedded store and on dynalite, beside the store
// operations an APPROVAL makes (the floor the handler adds to); and the
// bootstrap binary's init time through the Runtime API harness, beside a
// minimal aws-lambda-go hello world.
package librarian

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

var dynalite *testenv.Component

func TestMain(m *testing.M) { os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite)) }

const token = "claude-3-bench-token-0123456789"

// benchConfig is the shipped configuration with limits no benchmark reaches.
func benchConfig(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	agents := "agents:\n  claude-3:\n    type: code-generator\n    capabilities: [read, write, analyze, validate]\n    rate_limit: 100000000/hour\n    allowed_targets: [all]\n"
	protocol, err := os.ReadFile("../../functions/librarian/config/protocol.yaml")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agents.yaml"), []byte(agents), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "protocol.yaml"), protocol, 0o644); err != nil {
		b.Fatal(err)
	}
	return dir
}

func backends(b *testing.B) map[string]store.Store {
	b.Helper()
	st, err := store.OpenBolt(filepath.Join(b.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	out := map[string]store.Store{"embedded": st}
	if dynalite != nil {
		out["dynalite"] = store.NewDynamo(testenv.DynamoDBClient(dynalite.Endpoint),
			store.DynamoOptions{TablePrefix: fmt.Sprintf("bench%d-", time.Now().UnixNano()), Endpoint: dynalite.Endpoint})
	}
	return out
}

const design = `# Bench design\n\n## Overview\nx\n\n## Design\ny\n\n## Alternatives\nz\n`

var bodies = map[string]string{
	"APPROVAL": `{"agent_id":"claude-3","request_type":"APPROVAL","action":"create","target_type":"design","target_path":"docs/design/bench.md","content":"` + design + `","rationale":"bench"}`,
	"VALIDATE": `{"agent_id":"claude-3","request_type":"VALIDATE","action":"create","target_type":"design","target_path":"docs/design/bench.md","content":"` + design + `"}`,
	"QUERY":    `{"agent_id":"claude-3","request_type":"QUERY","content":"authentication requirements"}`,
}

// BenchmarkWarm: one request after another through the warm handler, in
// process; p50-ms is the median.
func BenchmarkWarm(b *testing.B) {
	for name, st := range backends(b) {
		ctx := context.Background()
		if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
			b.Fatal(err)
		}
		q, err := queue.OpenEmbedded(filepath.Join(b.TempDir(), "queue.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = q.Close() })
		if err := q.Ensure(ctx, service.EventsQueue); err != nil {
			b.Fatal(err)
		}
		lib, err := service.NewHandler(service.Config{ConfigDir: benchConfig(b), APIRate: "100000000/minute", ReadRate: "100000000/minute", ShutdownTimeout: time.Second, AgentTokens: []string{"claude-3=" + token}},
			service.Deps{Store: st, Queue: q})
		if err != nil {
			b.Fatal(err)
		}
		for _, typ := range []string{"APPROVAL", "VALIDATE", "QUERY"} {
			b.Run(name+"/"+typ, func(b *testing.B) {
				b.ReportAllocs()
				times := make([]time.Duration, 0, b.N)
				for b.Loop() {
					req := httptest.NewRequest(http.MethodPost, "/agent/request", strings.NewReader(bodies[typ]))
					req.Header.Set("Authorization", "Bearer "+token)
					req.Header.Set("Content-Type", "application/json")
					rec := httptest.NewRecorder()
					start := time.Now()
					lib.Handler.ServeHTTP(rec, req)
					times = append(times, time.Since(start))
					if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"approved"`) {
						b.Fatalf("%d %s", rec.Code, rec.Body)
					}
				}
				b.ReportMetric(p50(times), "p50-ms")
			})
		}
		// The floor: the store operations one APPROVAL makes (its two
		// rate counters in one commit, a path lookup, the create with its
		// decided-list entry and two statistics counters in one, the
		// outbox clear on the created version), without the handler.
		b.Run(name+"/store-floor", func(b *testing.B) {
			b.ReportAllocs()
			times := make([]time.Duration, 0, b.N)
			i := 0
			for b.Loop() {
				i++
				start := time.Now()
				exp := time.Now().Add(time.Hour)
				if _, err := st.AddMany(ctx, "librarian-limits", []store.Counter{{Key: store.Key{PK: "floor#a", SK: "w"}, Delta: 1, ExpiresAt: exp},
					{Key: store.Key{PK: "floor#b", SK: "w"}, Delta: 1, ExpiresAt: exp}}); err != nil {
					b.Fatal(err)
				}
				_, _ = st.Get(ctx, "librarian-graph", store.Key{PK: "paths", SK: "docs/design/bench.md"})
				key := store.Key{PK: fmt.Sprintf("floor#%d", i), SK: "req"}
				out, err := st.Write(ctx,
					store.PutOp("librarian-requests", store.Item{Key: store.Key{PK: "floor-decided", SK: key.PK}}, store.IfNotExists()),
					store.PutOp("librarian-requests", store.Item{Key: key, Data: []byte(strings.Repeat("x", 2048))}, store.IfNotExists()),
					store.AddOp("librarian-limits", store.Key{PK: "floor#c", SK: "w"}, 1, time.Time{}),
					store.AddOp("librarian-limits", store.Key{PK: "floor#d", SK: "w"}, 1, time.Time{}))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := st.Put(ctx, "librarian-requests", store.Item{Key: key, Data: []byte(strings.Repeat("y", 1024))}, store.IfVersion(out[1].Version)); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
			}
			b.ReportMetric(p50(times), "p50-ms")
		})
	}
}

func p50(times []time.Duration) float64 {
	if len(times) == 0 {
		return 0
	}
	slices.Sort(times)
	return float64(times[len(times)/2].Microseconds()) / 1000
}

// BenchmarkInit: start the binary under the Runtime API harness until it
// asks for its first event; the hello world is the floor. The two are
// started alternately in every iteration, so that the load of a shared
// machine weighs on both alike, and the ratio of their medians is reported.
func BenchmarkInit(b *testing.B) {
	if dynalite == nil {
		b.Skip("needs dynalite (not with -short)")
	}
	dir := b.TempDir()
	names := []string{"hello", "librarian"}
	bins := map[string]string{"librarian": "./functions/librarian", "hello": "./bench/librarian/hello"}
	for name, pkg := range bins {
		out := filepath.Join(dir, name)
		// Built as docs/deploy.md builds the bootstrap, without the RPC
		// shim (net/rpc, encoding/gob) the provided runtimes never use.
		if err := testenv.GoBuildTags(context.Background(), []string{"lambda.norpc"}, out, pkg); err != nil {
			b.Fatal(err)
		}
		bins[name] = out
	}
	env := []string{"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT=" + dynalite.Endpoint, "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		"AWS_REGION=us-east-1", "CONCLAVE_LOG_LEVEL=warn", "OTEL_EXPORTER_OTLP_ENDPOINT="}
	times := map[string][]time.Duration{}
	for b.Loop() {
		for _, name := range names {
			start := time.Now()
			rt, err := testenv.StartLambda(bins[name], env...)
			if err != nil {
				b.Fatal(err)
			}
			if err := rt.Ready(context.Background()); err != nil {
				b.Fatal(err)
			}
			times[name] = append(times[name], time.Since(start))
			rt.Stop()
		}
	}
	for _, name := range names {
		info, err := os.Stat(bins[name])
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(p50(times[name]), name+"-p50-ms")
		b.ReportMetric(float64(info.Size())/(1<<20), name+"-MiB")
	}
	b.ReportMetric(p50(times["librarian"])/p50(times["hello"]), "ratio")
}
