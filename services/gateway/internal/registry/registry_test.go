package registry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/gateway/internal/agentstream"
	"github.com/conclave-ai/conclave/services/gateway/internal/registry"
)

var dynalite *testenv.Component

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWith(m, testenv.Dynalite, &dynalite))
}

// stores are the backends replicas may share: the embedded file (replicas in
// one process) and DynamoDB on dynalite (replicas anywhere).
func stores(t *testing.T) map[string]store.Store {
	t.Helper()
	return testenv.Stores(t, dynalite, registry.Table)
}

// eachStore runs test on every store, each a parallel subtest named for
// it, in parallel with the other tests.
func eachStore(t *testing.T, test func(t *testing.T, st store.Store)) {
	t.Parallel()
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, st)
		})
	}
}

// faultyStore is a real store that one replica reaches through a path
// which can be made slow or cut; it counts the writes that get through.
type faultyStore struct {
	store.Store
	delay        atomic.Int64 // nanoseconds added before every write
	down         atomic.Bool
	agentWrites  atomic.Int64
	replicaWrite atomic.Int64
	leaseReads   atomic.Int64
	// Writes in flight now, and the most ever.
	inflight, maxInflight atomic.Int64
	// lostAnswers is how many agent writes to apply and then report
	// failed, as a store whose answer is lost on the way back does.
	lostAnswers atomic.Int64
	// failedDeletes is how many agent deletes to refuse.
	failedDeletes atomic.Int64
}

func (f *faultyStore) Get(ctx context.Context, table string, k store.Key) (store.Item, error) {
	if k.PK == "replicas" {
		f.leaseReads.Add(1)
	}
	return f.Store.Get(ctx, table, k)
}

var errCut = errors.New("connection to the store cut")

func (f *faultyStore) write(ctx context.Context, pk string) error {
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for m := f.maxInflight.Load(); n > m && !f.maxInflight.CompareAndSwap(m, n); m = f.maxInflight.Load() {
	}
	if d := time.Duration(f.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.down.Load() {
		return errCut
	}
	if pk == "agents" {
		f.agentWrites.Add(1)
	} else {
		f.replicaWrite.Add(1)
	}
	return nil
}

func (f *faultyStore) Put(ctx context.Context, table string, it store.Item, conds ...store.Condition) (store.Item, error) {
	if err := f.write(ctx, it.PK); err != nil {
		return store.Item{}, err
	}
	out, err := f.Store.Put(ctx, table, it, conds...)
	if err == nil && it.PK == "agents" && f.lostAnswers.Add(-1) >= 0 {
		return store.Item{}, errCut
	}
	return out, err
}

func (f *faultyStore) Delete(ctx context.Context, table string, k store.Key, conds ...store.Condition) error {
	if err := f.write(ctx, k.PK); err != nil {
		return err
	}
	if k.PK == "agents" && f.failedDeletes.Add(-1) >= 0 {
		return errCut
	}
	return f.Store.Delete(ctx, table, k, conds...)
}

type gateway struct {
	client  covenpb.CovenControlClient
	replica *registry.Replica
	store   *faultyStore
	stop    context.CancelFunc // stops the lease, as a crash would
}

// replica runs one gateway replica's agent side and its lease over st.
func replica(t *testing.T, id string, st store.Store, lease time.Duration) *gateway {
	t.Helper()
	fs := &faultyStore{Store: st}
	reg := registry.New(fs)
	registry.FreezeDeadEpochMemory(reg)
	var svc *agentstream.Service
	rep := reg.Replica(id, registry.ReplicaOptions{
		Lease:    lease,
		Holdings: func() []*gatewayv1.Agent { return svc.Holdings() },
		Lost:     func(agentID, instanceID string, reason error) { svc.Lost(agentID, instanceID, reason) },
	})
	svc = agentstream.New(agentstream.Options{ServerID: id, InstancePrefix: id + "-" + rep.Boot(), Registry: rep}, slog.New(slog.DiscardHandler))
	ctx, stop := context.WithCancel(context.Background())
	go rep.Run(ctx, "addr-"+id)
	t.Cleanup(stop)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(agentstream.ServerOption())
	covenpb.RegisterCovenControlServer(srv, svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///"+id,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &gateway{client: covenpb.NewCovenControlClient(conn), replica: rep, store: fs, stop: stop}
}

// registerEventually retries a registration refused with UNAVAILABLE (a
// replica still taking its lease) or ALREADY_EXISTS (a lease still to
// expire), within a minute.
func registerEventually(t *testing.T, c covenpb.CovenControlClient, id string, retry ...codes.Code) agentStream {
	t.Helper()
	var s agentStream
	testenv.EventuallyNoError(t, time.Minute, "registering "+id, func() error {
		var err error
		s, err = register(t, c, id)
		if err != nil && !slices.Contains(append(retry, codes.Unavailable), status.Code(err)) {
			t.Fatalf("register %s: %v", id, err)
		}
		return err
	})
	return s
}

// listed returns the IDs the cluster view shows, and their replicas.
func listed(t *testing.T, reg *registry.Registry) map[string]string {
	t.Helper()
	out := map[string]string{}
	cursor := ""
	for {
		page, next, err := reg.List(context.Background(), 1000, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page {
			out[a.GetAgentId()] = a.GetServerId()
		}
		if next == "" {
			return out
		}
		cursor = next
	}
}

type agentStream = grpc.BidiStreamingClient[covenpb.AgentMessage, covenpb.ServerMessage]

// register opens a stream and registers id; it returns the stream and the
// status the registration ended with (OK on Welcome).
func register(t *testing.T, c covenpb.CovenControlClient, id string) (agentStream, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.AgentStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: id}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return s, err
		}
		if m.GetWelcome() != nil {
			return s, nil
		}
	}
}

func drain(s agentStream) error {
	for {
		if _, err := s.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

func TestDuplicateRefusedAcrossReplicas(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		reg := registry.New(st)
		a, b := replica(t, "gw-a", st, 15*time.Second), replica(t, "gw-b", st, 15*time.Second)
		first := registerEventually(t, a.client, "agent-1")
		_, err := register(t, b.client, "agent-1")
		if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "gw-a") {
			t.Fatalf("duplicate on another replica: %v, want ALREADY_EXISTS naming gw-a", err)
		}
		got, err := reg.Get(context.Background(), "agent-1")
		if err != nil || got.GetServerId() != "gw-a" {
			t.Fatalf("registry entry: %v %v", got, err)
		}
		// Disconnecting releases the registration at once: the agent can
		// come back through another replica without waiting for expiry.
		_ = first.CloseSend()
		if err := drain(first); err != nil {
			t.Fatal(err)
		}
		registerEventually(t, b.client, "agent-1")
		if got := listed(t, reg); len(got) != 1 || got["agent-1"] != "gw-b" {
			t.Fatalf("list = %v", got)
		}
		if addr, err := reg.ReplicaAddr(context.Background(), "gw-b"); err != nil || addr != "addr-gw-b" {
			t.Fatalf("ReplicaAddr = %q, %v", addr, err)
		}
	})
}

// TestCrashedReplicaFreesAgents stops a replica's lease without a word, as
// a crash would: its agents stay registered until the lease expires, and
// are then free, together, for another replica.
func TestCrashedReplicaFreesAgents(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		reg := registry.New(st)
		dead := replica(t, "gw-dead", st, 600*time.Millisecond)
		for _, id := range []string{"orphan-1", "orphan-2"} {
			registerEventually(t, dead.client, id)
		}
		dead.stop()
		b := replica(t, "gw-b", st, 15*time.Second)
		registerEventually(t, b.client, "orphan-1", codes.AlreadyExists)
		registerEventually(t, b.client, "orphan-2", codes.AlreadyExists)
		if got := listed(t, reg); got["orphan-1"] != "gw-b" || got["orphan-2"] != "gw-b" {
			t.Fatalf("after the crash: %v", got)
		}
		if _, err := reg.ReplicaAddr(context.Background(), "gw-dead"); status.Code(err) != codes.Unavailable {
			t.Fatalf("a dead replica's address: %v, want UNAVAILABLE", err)
		}
	})
}

// TestWithdrawFreesAgentsInOneWrite: a replica shutting down gives up its
// lease (one write), which frees all its agents at once for another
// replica; their disconnections then write nothing.
func TestWithdrawFreesAgentsInOneWrite(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		reg := registry.New(st)
		leaving := replica(t, "gw-leaving", st, 15*time.Second)
		streams := map[string]agentStream{}
		for _, id := range []string{"mover-1", "mover-2", "mover-3"} {
			streams[id] = registerEventually(t, leaving.client, id)
		}
		agentWrites := leaving.store.agentWrites.Load()
		if err := leaving.replica.Withdraw(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := listed(t, reg); len(got) != 0 {
			t.Fatalf("after Withdraw the cluster still lists %v", got)
		}
		// Another replica takes them while they are still connected here,
		// as agents told to leave reconnect elsewhere.
		other := replica(t, "gw-other", st, 15*time.Second)
		for id := range streams {
			registerEventually(t, other.client, id)
		}
		for id, s := range streams {
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if err := drain(s); err != nil && status.Code(err) != codes.Canceled {
				t.Fatalf("%s: %v", id, err)
			}
		}
		if got := listed(t, reg); len(got) != 3 || got["mover-1"] != "gw-other" || got["mover-2"] != "gw-other" || got["mover-3"] != "gw-other" {
			t.Fatalf("after the moves: %v", got)
		}
		if n := leaving.store.agentWrites.Load() - agentWrites; n != 0 {
			t.Fatalf("the withdrawn replica wrote %d agent records; want none", n)
		}
		if _, err := reg.ReplicaAddr(context.Background(), "gw-leaving"); status.Code(err) != codes.Unavailable {
			t.Fatalf("the withdrawn replica's address: %v, want UNAVAILABLE", err)
		}
	})
}

// TestBurstOfRegistrationsIsMetered: a burst of registrations over a slow
// store never has more than MaxConcurrentClaims store calls in flight; the
// rest wait their turn, and all get through.
func TestBurstOfRegistrationsIsMetered(t *testing.T) {
	t.Parallel()
	st := stores(t)["embedded"]
	gw := replica(t, "gw-burst", st, 15*time.Second)
	registerEventually(t, gw.client, "first") // the lease is taken
	gw.store.delay.Store(int64(20 * time.Millisecond))
	const burst = 3 * registry.MaxConcurrentClaims
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := register(t, gw.client, fmt.Sprintf("burst-%d", i)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("registration refused: %v", err)
	}
	if got := gw.store.maxInflight.Load(); got > registry.MaxConcurrentClaims {
		t.Fatalf("%d store writes in flight at once; want at most %d", got, registry.MaxConcurrentClaims)
	}
	if got := listed(t, registry.New(st)); len(got) != burst+1 {
		t.Fatalf("cluster lists %d agents, want %d", len(got), burst+1)
	}
}

// TestDeadReplicaLeaseReadOnce: agents of a replica that shut down
// re-register elsewhere, each replacing its stale record; the dead lease is
// read once for all of them, not once per agent.
func TestDeadReplicaLeaseReadOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		old := replica(t, "gw-old", st, 15*time.Second)
		const n = 20
		for i := range n {
			registerEventually(t, old.client, fmt.Sprintf("agent-%d", i))
		}
		if err := old.replica.Withdraw(context.Background()); err != nil {
			t.Fatal(err)
		}
		next := replica(t, "gw-next", st, 15*time.Second)
		registerEventually(t, next.client, "warm-up") // the lease is taken
		before := next.store.leaseReads.Load()
		for i := range n {
			registerEventually(t, next.client, fmt.Sprintf("agent-%d", i))
		}
		if got := next.store.leaseReads.Load() - before; got != 1 {
			t.Fatalf("%d reads of leases for %d agents of one dead replica; want 1", got, n)
		}
		if got := listed(t, registry.New(st)); len(got) != n+1 {
			t.Fatalf("cluster lists %d agents, want %d", len(got), n+1)
		}
	})
}

// TestStaleRecordsAreSwept: registrations whose replica is gone are
// invisible at once and deleted by a sweep; live ones stay.
func TestStaleRecordsAreSwept(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		reg := registry.New(st)
		dead, live := replica(t, "gw-dead", st, 400*time.Millisecond), replica(t, "gw-live", st, 15*time.Second)
		registerEventually(t, dead.client, "gone")
		registerEventually(t, live.client, "here")
		dead.stop()
		testenv.Eventually(t, time.Minute, "the dead replica's agent unlisted", func() bool {
			return len(listed(t, reg)) == 1
		})
		n, err := reg.Sweep(context.Background())
		if err != nil || n != 1 {
			t.Fatalf("Sweep = %d, %v; want 1 record swept", n, err)
		}
		if _, err := st.Get(context.Background(), registry.Table.Name, store.Key{PK: "agents", SK: "gone"}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("stale record still stored: %v", err)
		}
		if got := listed(t, reg); got["here"] != "gw-live" {
			t.Fatalf("the live agent was swept: %v", got)
		}
	})
}

// TestRegistrationWhoseAnswerWasLost: the store applies a registration's
// write but its answer is lost, so the registration fails. The agent's
// next attempt on the same replica registers: the failed attempt gives its
// record back, and when that fails too, the record is its own replica's,
// of a connection it no longer has, not a live holder's (both ways, it
// refused the agent until the replica stopped).
func TestRegistrationWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	for name, st := range stores(t) {
		for _, releaseFails := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/release fails %v", name, releaseFails), func(t *testing.T) {
				t.Parallel()
				registrationWhoseAnswerWasLost(t, st, releaseFails)
			})
		}
	}
}

func registrationWhoseAnswerWasLost(t *testing.T, st store.Store, releaseFails bool) {
	server, agent := fmt.Sprintf("gw-lossy-%v", releaseFails), fmt.Sprintf("lossy-%v", releaseFails)
	gw := replica(t, server, st, 15*time.Second)
	registerEventually(t, gw.client, "warm-up-"+agent)
	gw.store.lostAnswers.Store(1)
	if releaseFails {
		gw.store.failedDeletes.Store(1)
	}
	if _, err := register(t, gw.client, agent); status.Code(err) != codes.Unavailable {
		t.Fatalf("the registration whose answer was lost: %v, want UNAVAILABLE", err)
	}
	if _, err := register(t, gw.client, agent); err != nil {
		t.Fatalf("the agent's next attempt: %v", err)
	}
	if got := listed(t, registry.New(st)); got[agent] != server {
		t.Fatalf("listed %v", got)
	}
}

// TestIdleAgentsCostNoWrites: once registered, agents cost the store
// nothing; the replica's one lease is all that is written. The lease is
// long enough that a loaded machine does not delay a renewal past it (at
// 300 ms a fresh CI run's did, and the replica rightly wrote its agents
// again).
func TestIdleAgentsCostNoWrites(t *testing.T) {
	t.Parallel()
	st := stores(t)["embedded"]
	gw := replica(t, "gw-a", st, 2*time.Second)
	for i := range 50 {
		registerEventually(t, gw.client, fmt.Sprintf("idle-%d", i))
	}
	agentWrites, leaseWrites := gw.store.agentWrites.Load(), gw.store.replicaWrite.Load()
	testenv.Eventually(t, time.Minute, "three lease periods of renewals", func() bool {
		return gw.store.replicaWrite.Load() >= leaseWrites+9
	})
	if n := gw.store.agentWrites.Load() - agentWrites; n != 0 {
		t.Fatalf("%d agent writes while 50 agents sat idle for three leases; want none", n)
	}
	if got := listed(t, registry.New(st)); len(got) != 50 {
		t.Fatalf("cluster view shows %d agents, want 50", len(got))
	}
}

// TestSlowStoreEvictsNoAgent makes every write of a replica take longer
// than its renewal interval (a third of the lease), though less than half
// the lease, for over a lease: renewals are late, none fails, and no agent
// is evicted or hidden.
func TestSlowStoreEvictsNoAgent(t *testing.T) {
	t.Parallel()
	st := stores(t)["embedded"]
	const lease = 3 * time.Second
	gw := replica(t, "gw-slow", st, lease)
	var streams []agentStream
	for i := range 20 {
		streams = append(streams, registerEventually(t, gw.client, fmt.Sprintf("patient-%d", i)))
	}
	gw.store.delay.Store(int64(lease * 5 / 12))
	before := gw.store.replicaWrite.Load()
	testenv.Eventually(t, time.Minute, "slow renewals spanning more than a lease", func() bool {
		return gw.store.replicaWrite.Load() >= before+3
	})
	gw.store.delay.Store(0)
	if err := gw.replica.Healthy(); err != nil {
		t.Fatalf("after a slow lease period: %v", err)
	}
	if got := listed(t, registry.New(st)); len(got) != 20 {
		t.Fatalf("cluster view shows %d agents, want 20: %v", len(got), got)
	}
	assertNothingReceived(t, streams)
}

// assertNothingReceived checks that no stream was sent anything (a
// Shutdown, an error) by sending a heartbeat-free probe: each stream is
// still open and quiet.
func assertNothingReceived(t *testing.T, streams []agentStream) {
	t.Helper()
	for i, s := range streams {
		got := make(chan error, 1)
		go func() { _, err := s.Recv(); got <- err }()
		select {
		case err := <-got:
			t.Fatalf("stream %d was sent something or ended: %v", i, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestStoreOutage cuts a replica off from the store for longer than its
// lease. While cut, it refuses new agents with UNAVAILABLE and keeps those
// it holds; meanwhile another replica takes one of them (a second
// connection of the same agent). When the store is back, the replica takes
// a new lease, its agents are registered again, and the one taken is told
// to reconnect.
func TestStoreOutage(t *testing.T) {
	eachStore(t, func(t *testing.T, st store.Store) {
		reg := registry.New(st)
		const lease = 900 * time.Millisecond
		a, b := replica(t, "gw-a", st, lease), replica(t, "gw-b", st, 15*time.Second)
		kept := registerEventually(t, a.client, "kept")
		taken := registerEventually(t, a.client, "taken")

		a.store.down.Store(true)
		testenv.Eventually(t, time.Minute, "the replica to notice the outage", func() bool {
			return a.replica.Healthy() != nil
		})
		_, err := register(t, a.client, "newcomer")
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "gw-a") {
			t.Fatalf("registration while cut off: %v, want UNAVAILABLE naming the replica", err)
		}
		// Once a's lease has expired, its agents are free elsewhere.
		registerEventually(t, b.client, "taken", codes.AlreadyExists)

		a.store.down.Store(false)
		m, err := taken.Recv()
		if err != nil || !strings.Contains(m.GetShutdown().GetReason(), "another connection") {
			t.Fatalf("the agent taken elsewhere: %v, %v; want Shutdown", m, err)
		}
		if err := drain(taken); status.Code(err) != codes.Canceled {
			t.Fatalf("its stream ended with %v, want CANCELLED", err)
		}
		testenv.EventuallyNoError(t, time.Minute, "kept on gw-a and taken on gw-b in the cluster view", func() error {
			if got := listed(t, reg); got["kept"] != "gw-a" || got["taken"] != "gw-b" || len(got) != 2 {
				return fmt.Errorf("cluster view %v", got)
			}
			return nil
		})
		registerEventually(t, a.client, "newcomer")
		assertNothingReceived(t, []agentStream{kept})
	})
}

// TestSameServerIDRefused: a second replica under a server ID already
// holding a live lease takes no agents, and says why.
func TestSameServerIDRefused(t *testing.T) {
	t.Parallel()
	st := stores(t)["embedded"]
	first := replica(t, "gw-twin", st, 15*time.Second)
	registerEventually(t, first.client, "one")
	second := replica(t, "gw-twin", st, 15*time.Second)
	_, err := register(t, second.client, "two")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "CONCLAVE_GATEWAY_SERVER_ID") {
		t.Fatalf("registration at a twin replica: %v, want UNAVAILABLE naming the setting", err)
	}
}
