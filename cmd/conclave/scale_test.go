package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
)

// defaultLease is CONCLAVE_GATEWAY_LEASE's default; the scale tests hold
// their agents for three of them, on default settings.
const defaultLease = 15 * time.Second

// swarmProc is `conclave agent swarm` holding idle agents.
type swarmProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// startSwarm holds count idle agents named prefix<n> on the gateway at addr
// and returns once all are registered.
func startSwarm(t *testing.T, addr, prefix string, count int) *swarmProc {
	t.Helper()
	cmd := exec.Command(conclaveBin, "agent", "swarm", "--addr", addr, "--count", fmt.Sprint(count), "--prefix", prefix)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	s := &swarmProc{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	if st := s.next(t); st.Event != "registered" || st.Registered != int64(count) {
		t.Fatalf("swarm %s: %+v, want %d registered", prefix, st, count)
	}
	return s
}

func (s *swarmProc) next(t *testing.T) swarmStatus {
	t.Helper()
	if !s.lines.Scan() {
		t.Fatalf("swarm ended: %v", s.lines.Err())
	}
	var st swarmStatus
	if err := json.Unmarshal(s.lines.Bytes(), &st); err != nil {
		t.Fatalf("swarm printed %q: %v", s.lines.Text(), err)
	}
	return st
}

// status asks the swarm how its agents fare.
func (s *swarmProc) status(t *testing.T) swarmStatus {
	t.Helper()
	if _, err := io.WriteString(s.stdin, "status\n"); err != nil {
		t.Fatal(err)
	}
	return s.next(t)
}

// clusterView lists every agent through the gateway at addr: agent ID →
// replica.
func clusterView(t *testing.T, addr, token string) map[string]string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := gatewayv1.NewGatewayServiceClient(conn)
	ctx := context.Background()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	out := map[string]string{}
	req := &gatewayv1.ListAgentsRequest{PageSize: 500}
	for {
		resp, err := client.ListAgents(ctx, req)
		if err != nil {
			t.Fatalf("ListAgents: %v", err)
		}
		for _, a := range resp.GetAgents() {
			out[a.GetAgentId()] = a.GetServerId()
		}
		if resp.GetNextPageToken() == "" {
			return out
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// checkHeld checks that every swarm kept all its agents through the hold,
// and that the cluster view lists exactly them, on the replicas expected.
func checkHeld(t *testing.T, view map[string]string, swarms map[string]*swarmProc, count int, replicaOf func(prefix string) string) {
	t.Helper()
	for prefix, s := range swarms {
		st := s.status(t)
		if st.Registered != int64(count) || st.Shutdowns != 0 || st.Ended != 0 || st.Registrations != int64(count) {
			t.Errorf("swarm %s after three leases: %+v; want all %d held, none told to leave or cut off", prefix, st, count)
		}
		for i := range count {
			id := fmt.Sprintf("%s%d", prefix, i)
			if got := view[id]; got != replicaOf(prefix) {
				t.Fatalf("cluster view: %s on %q, want %q", id, got, replicaOf(prefix))
			}
		}
	}
	if len(view) != count*len(swarms) {
		t.Errorf("cluster view lists %d agents, want %d", len(view), count*len(swarms))
	}
}

// TestDevHoldsIdleAgents: conclave dev, on its default settings, holds
// 5,000 idle agents for three lease periods. None is told to leave or cut
// off, and the cluster view lists exactly them.
func TestDevHoldsIdleAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 5,000 agents for 45 seconds")
	}
	t.Parallel()
	_, addrs, stderr := devProcess(t, t.TempDir())
	const count = 5000
	swarm := startSwarm(t, addrs["gateway gRPC"], "idle-", count)
	time.Sleep(3*defaultLease + time.Second) // the scenario: three leases of idleness
	checkHeld(t, clusterView(t, addrs["gateway gRPC"], ""), map[string]*swarmProc{"idle-": swarm}, count,
		func(string) string { return "dev" })
	if t.Failed() {
		t.Logf("conclave dev's log:\n%s", stderr)
	}
}

// TestReplicasOnDynamoDBHoldIdleAgents: three gateway replicas on one
// DynamoDB (dynalite), on default lease settings, hold 1,000 idle agents
// each for three lease periods, and every replica's cluster view is exact.
func TestReplicasOnDynamoDBHoldIdleAgents(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dynalite and three gateway processes, and holds 3,000 agents for 45 seconds")
	}
	t.Parallel()
	ctx := context.Background()
	dynalite := testenv.DynaliteFor(t)
	gatewayBin := filepath.Join(t.TempDir(), "gateway")
	if err := testenv.GoBuild(ctx, gatewayBin, "./services/gateway/cmd/gateway"); err != nil {
		t.Fatal(err)
	}
	const count, token = 1000, "client-secret-0123456789"
	replicas := map[string]string{} // server ID → gRPC address
	var logs []*testenv.LockedBuffer
	for i := range 3 {
		id := fmt.Sprintf("gw-%d", i)
		addr, log := startGatewayProcess(t, gatewayBin, id, dynalite.Endpoint, token)
		replicas[id], logs = addr, append(logs, log)
	}
	swarms := map[string]*swarmProc{}
	for id, addr := range replicas {
		swarms[id+"-"] = startSwarm(t, addr, id+"-", count)
	}
	time.Sleep(3*defaultLease + time.Second)
	for id, addr := range replicas {
		t.Run("view from "+id, func(t *testing.T) {
			checkHeld(t, clusterView(t, addr, token), swarms, count, func(prefix string) string { return prefix[:len(prefix)-1] })
		})
	}
	if t.Failed() {
		for _, l := range logs {
			t.Logf("replica log:\n%s", l)
		}
	}
}

// startGatewayProcess runs the standalone gateway as replica id on the
// DynamoDB at endpoint, on default settings but for addresses and tokens.
// It listens on a port of its own choosing, read from its "serving" log
// line, so that no other process can take the port in between.
func startGatewayProcess(t *testing.T, bin, id, endpoint, token string) (string, *testenv.LockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gw, err := testenv.StartDeployable(ctx, "gateway replica "+id, bin,
		"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT="+endpoint, "CONCLAVE_TABLE_PREFIX=scale-",
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1",
		"CONCLAVE_GATEWAY_GRPC_ADDR=127.0.0.1:0", "CONCLAVE_GATEWAY_HTTP_ADDR=",
		"CONCLAVE_GATEWAY_SERVER_ID="+id, "CONCLAVE_GATEWAY_CLIENT_TOKENS="+token,
		"CONCLAVE_GATEWAY_ALLOW_AGENTS_WITHOUT_TOKENS=true",
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Kill)
	return gw.GRPCAddr, gw.LogBuffer()
}
