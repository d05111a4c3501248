//go:build linux

package kubetest_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

const (
	gwAgentToken  = runnertest.GatewayAgentToken
	gwClientToken = runnertest.GatewayClientToken
)

// startGateway runs the gateway binary on loopback over an embedded store
// of its own, opening every agent_id to the runner's token, and returns
// its gRPC address.
func startGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gateway")
	if err := testenv.GoBuild(t.Context(), bin, "./services/gateway/cmd/gateway"); err != nil {
		t.Fatal(err)
	}
	// One client sends the 100 messages at once.
	return runnertest.StartGateway(t, bin, "kubetest-gw",
		"CONCLAVE_GATEWAY_CLIENT_STREAMS=1000", "CONCLAVE_GATEWAY_CLIENT_RATE=10000", "CONCLAVE_GATEWAY_CLIENT_BURST=10000").GRPCAddr
}

// TestHundredGatewayAgents launches 100 agents at once, each in its own
// Job's pod on the node, with gateway: true: the runner registers every
// one at the gateway, which lists all 100, and a message sent to each at
// once is answered by its agent in its pod.
func TestHundredGatewayAgents(t *testing.T) {
	skipShort(t)
	const n = 100
	gwAddr := startGateway(t)
	r := newRunnerState(t, freeLoopbackAddr(t), map[string]string{
		"CONCLAVE_RUNNER_WORKERS":       "120", // each live agent holds a worker
		"CONCLAVE_RUNNER_GATEWAY_ADDR":  gwAddr,
		"CONCLAVE_RUNNER_GATEWAY_TOKEN": gwAgentToken,
		"CONCLAVE_RUNNER_SERVER_ID":     "kubetest",
	}).run(t, nil)
	conn, err := grpc.NewClient(gwAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	gw := gatewayv1.NewGatewayServiceClient(conn)
	authed := func(ctx context.Context) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gwClientToken)
	}

	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var in instance
			if code := r.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
				"task_id": fmt.Sprintf("hundred-%d", i), "agent_type": "on-gateway", "workspace_path": workspace(t),
			}, &in); code != http.StatusOK {
				t.Errorf("launch %d: HTTP %d", i, code)
			}
			ids[i] = in.ID
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(func() {
		// t.Context() has ended by now.
		for _, id := range ids {
			if code := r.Do(t, "DELETE", "/api/v1/agents/"+id, nil, nil); code != http.StatusOK {
				t.Errorf("delete %s: HTTP %d", id, code)
			}
		}
	})

	// All 100 registered: their pods up, their sessions open.
	deadline := time.Now().Add(10 * time.Minute)
	var listed map[string]*gatewayv1.Agent
	for {
		listed = map[string]*gatewayv1.Agent{}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		resp, err := gw.ListAgents(authed(ctx), &gatewayv1.ListAgentsRequest{PageSize: 500})
		cancel()
		if err == nil {
			for _, a := range resp.GetAgents() {
				listed[a.GetAgentId()] = a
			}
		}
		missing := 0
		for _, id := range ids {
			if listed[id] == nil {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 minutes the gateway lists %d of the %d agents (%v)", n-missing, n, err)
		}
		time.Sleep(time.Second)
	}
	for _, id := range ids {
		// Where it runs is its Job, not the runner replica.
		if host := listed[id].GetMetadata().GetHostname(); host == "" || host == "kubetest" {
			t.Errorf("agent %s runs on %q, want its Job", id, host)
		}
	}

	// A message to each, all at once.
	for i, id := range ids {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(authed(t.Context()), 5*time.Minute)
			defer cancel()
			st, err := gw.SendMessage(ctx, &gatewayv1.SendMessageRequest{AgentId: id, Content: fmt.Sprintf("hello %d", i)})
			if err != nil {
				t.Errorf("SendMessage to %s: %v", id, err)
				return
			}
			var text strings.Builder
			for {
				m, err := st.Recv()
				if err != nil {
					t.Errorf("agent %s: the stream ended before the request did: %v", id, err)
					return
				}
				switch ev := m.GetEvent().GetEvent().(type) {
				case *covenpb.MessageResponse_Text:
					text.WriteString(ev.Text)
				case *covenpb.MessageResponse_Done:
					if want := fmt.Sprintf("Working on: hello %d", i); !strings.Contains(ev.Done.GetFullResponse(), want) {
						t.Errorf("agent %s answered %q, want %q in it", id, ev.Done.GetFullResponse(), want)
					}
					return
				case *covenpb.MessageResponse_Error:
					t.Errorf("agent %s: error %q", id, ev.Error)
					return
				case *covenpb.MessageResponse_Cancelled:
					t.Errorf("agent %s: cancelled", id)
					return
				}
			}
		})
	}
	wg.Wait()
}
