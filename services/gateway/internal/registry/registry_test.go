package registry_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
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

var seq atomic.Int64

// stores are the backends replicas may share: the embedded file (replicas in
// one process) and DynamoDB on dynalite (replicas anywhere).
func stores(t *testing.T) map[string]store.Store {
	t.Helper()
	bolt, err := store.OpenBolt(filepath.Join(t.TempDir(), "s.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bolt.Close() })
	out := map[string]store.Store{"embedded": bolt}
	if dynalite != nil {
		out["dynamodb"] = store.NewDynamo(testenv.DynamoDBClient(dynalite.Endpoint),
			store.DynamoOptions{TablePrefix: fmt.Sprintf("r%d-", seq.Add(1)), Endpoint: dynalite.Endpoint})
	}
	for name, s := range out {
		if err := s.EnsureTable(context.Background(), registry.Table); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return out
}

// replica runs one gateway replica's agent side over reg.
func replica(t *testing.T, id string, reg *registry.Registry, lease time.Duration) covenpb.CovenControlClient {
	t.Helper()
	svc := agentstream.New(agentstream.Options{ServerID: id, Registry: reg, Lease: lease}, slog.New(slog.DiscardHandler))
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
	return covenpb.NewCovenControlClient(conn)
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
	t.Parallel()
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reg := registry.New(st)
			a, b := replica(t, "gw-a", reg, 15*time.Second), replica(t, "gw-b", reg, 15*time.Second)
			first, err := register(t, a, "agent-1")
			if err != nil {
				t.Fatal(err)
			}
			_, err = register(t, b, "agent-1")
			if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "gw-a") {
				t.Fatalf("duplicate on another replica: %v, want ALREADY_EXISTS naming gw-a", err)
			}
			got, err := reg.Get(context.Background(), "agent-1")
			if err != nil || got.GetServerId() != "gw-a" {
				t.Fatalf("registry entry: %v %v", got, err)
			}
			// Disconnecting releases the lease at once: the agent can come
			// back through another replica without waiting for expiry.
			_ = first.CloseSend()
			if err := drain(first); err != nil {
				t.Fatal(err)
			}
			if _, err := register(t, b, "agent-1"); err != nil {
				t.Fatalf("re-registration on another replica: %v", err)
			}
			list, _, err := reg.List(context.Background(), 10, "")
			if err != nil || len(list) != 1 || list[0].GetServerId() != "gw-b" {
				t.Fatalf("list = %v, %v", list, err)
			}
		})
	}
}

// TestCrashedReplicaLeaseExpires claims an agent as a replica that then
// dies (nothing renews or releases it): once the lease runs out, the agent
// registers elsewhere.
func TestCrashedReplicaLeaseExpires(t *testing.T) {
	t.Parallel()
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reg := registry.New(st)
			crashed := &gatewayv1.Agent{AgentId: "orphan", ServerId: "gw-dead", InstanceId: "gw-dead-1"}
			if err := reg.Claim(context.Background(), crashed, 500*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			b := replica(t, "gw-b", reg, 15*time.Second)
			if _, err := register(t, b, "orphan"); status.Code(err) != codes.AlreadyExists {
				t.Fatalf("while the dead replica's lease lives: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for {
				_, err := register(t, b, "orphan")
				if err == nil {
					break
				}
				if status.Code(err) != codes.AlreadyExists || ctx.Err() != nil {
					t.Fatalf("after the lease: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// TestLostLeaseEndsStream takes an agent's registration away behind its
// replica's back; at the next renewal the replica ends the stream.
func TestLostLeaseEndsStream(t *testing.T) {
	t.Parallel()
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reg := registry.New(st)
			a := replica(t, "gw-a", reg, 600*time.Millisecond)
			s, err := register(t, a, "stolen")
			if err != nil {
				t.Fatal(err)
			}
			thief := &gatewayv1.Agent{AgentId: "stolen", ServerId: "gw-z", InstanceId: "gw-z-9"}
			if err := reg.Release(context.Background(), "stolen", "gw-a-1"); err != nil {
				t.Fatal(err)
			}
			if err := reg.Claim(context.Background(), thief, time.Minute); err != nil {
				t.Fatal(err)
			}
			// The agent is told to reconnect, and why; gRPC reports a stream
			// the gateway cancels as CANCELLED.
			m, err := s.Recv()
			if err != nil || !strings.Contains(m.GetShutdown().GetReason(), "stolen") {
				t.Fatalf("want Shutdown naming the agent, got %v, %v", m, err)
			}
			if err := drain(s); status.Code(err) != codes.Canceled {
				t.Fatalf("stream ended with %v, want CANCELLED", err)
			}
			if reason := s.Trailer().Get("conclave-close-reason"); len(reason) != 1 || !strings.Contains(reason[0], "stolen") {
				t.Fatalf("conclave-close-reason trailer = %q, want the lost lease explained", reason)
			}
			got, err := reg.Get(context.Background(), "stolen")
			if err != nil || got.GetServerId() != "gw-z" {
				t.Fatalf("the new holder's entry was disturbed: %v %v", got, err)
			}
		})
	}
}
