package gateway_test

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// connSetting is one grpc-go server setting tried on the gateway, added
// after the gateway's own options so that it takes their place.
type connSetting struct {
	name string
	opts []grpc.ServerOption
}

// connSettings are the per-connection settings grpc-go offers for memory:
// its defaults (in 1.85 the write buffer is shared and the read buffer
// pooled, both 32 KiB), the unshared write buffer that was the default
// before, smaller buffers, no buffers at all, and no keepalive pings.
var connSettings = []connSetting{
	{"default", nil},
	//lint:ignore SA1019 the old default is measured to show what sharing saves.
	{"unshared-write-buffer", []grpc.ServerOption{grpc.SharedWriteBuffer(false)}},
	{"buffers-4KiB", []grpc.ServerOption{grpc.ReadBufferSize(4 << 10), grpc.WriteBufferSize(4 << 10)}},
	{"unbuffered", []grpc.ServerOption{grpc.ReadBufferSize(0), grpc.WriteBufferSize(0)}},
	// The gateway finds dead agents by keepalive (docs/gateway.md); this
	// shows what the pings cost, not a setting it could run on.
	{"keepalive-off", []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{Time: infinity})}},
}

// infinity is what grpc-go reads as "never" for keepalive times.
const infinity = time.Duration(1<<63 - 1)

// startGatewaySetting starts a gateway with setting s. Its store writes
// are not counted: idleCost then skips its 30 s idle window.
func startGatewaySetting(s connSetting) func(*testing.B) *target {
	return func(b *testing.B) *target {
		tg := startGatewayOpts(b, "127.0.0.1:0", boltAt(filepath.Join(tempDir(b), "state.db")), s.opts)
		tg.name, tg.writes = "gateway-"+s.name, nil
		return tg
	}
}

// BenchmarkConnSettings measures each of connSettings on the gateway for
// memory and for latency side by side in one run:
//
//	idle:      BENCH_SETTING_AGENTS idle agents (default 5,000), one
//	           connection each, as BenchmarkIdleAgentMemoryConnEach; the
//	           relay floor on grpc-go's defaults is measured once, first.
//	roundtrip: BenchmarkRoundTrip's one-event request, p50 and p99.
//	stream:    BenchmarkEvents/1x1's 1,000 events per request.
//
// Each setting's gateway serves both its agent's and its client's
// connections, so a setting applies to both ends of the gateway.
func BenchmarkConnSettings(b *testing.B) {
	k := envInt("BENCH_SETTING_AGENTS", 5000)
	var floorOnce sync.Once
	var floor idleResult
	for _, s := range connSettings {
		b.Run(s.name, func(b *testing.B) {
			b.Run("idle", func(b *testing.B) {
				floorOnce.Do(func() { floor = idleCost(b, startRelay, k, 1) })
				gw := idleOnce(s, func() idleResult { return idleCost(b, startGatewaySetting(s), k, 1) })
				b.ReportMetric(gw.heap+gw.stack, "bytes/agent")
				b.ReportMetric(gw.heap, "heap-bytes/agent")
				b.ReportMetric(gw.rss, "rss-bytes/agent")
				b.ReportMetric(gw.goroutines, "goroutines/agent")
				b.ReportMetric((gw.heap+gw.stack)/(floor.heap+floor.stack), "ratio-to-floor")
				b.ReportMetric(float64(k), "agents")
			})
			tg := startGatewaySetting(s)(b)
			callCtx, client := echoClient(b, tg)
			warm(b, tg.name, echoOnce(callCtx, client))
			b.Run("roundtrip", func(b *testing.B) { roundTrips(b, echoOnce(callCtx, client)) })
			b.Run("stream", func(b *testing.B) { streams(b, callCtx, client, "echo", 1000) })
		})
	}
}

var idleBySetting struct {
	sync.Mutex
	m map[string]idleResult
}

// idleOnce measures setting s's idle memory the first time it is asked
// for, however often the framework calls the benchmark.
func idleOnce(s connSetting, measure func() idleResult) idleResult {
	idleBySetting.Lock()
	defer idleBySetting.Unlock()
	if r, ok := idleBySetting.m[s.name]; ok {
		return r
	}
	if idleBySetting.m == nil {
		idleBySetting.m = map[string]idleResult{}
	}
	r := measure()
	idleBySetting.m[s.name] = r
	return r
}
