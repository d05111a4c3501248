//go:build linux

package kubetest_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/pkg/testenv/kubeenv"
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

// gatewayForPods is the runner's settings for a gateway on loopback at
// gwAddr whose agents are in Jobs: agent-host dials it through a forward
// from the node's address, with the token of a Secret of the operator's in
// the agents' namespace; the runner never holds that token.
func gatewayForPods(t *testing.T, gwAddr string) map[string]string {
	t.Helper()
	fwd, err := env.node.Forward(kubeenv.KubeNodeIP+":0", gwAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fwd.Close() })
	name := "gateway-token-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if _, err := env.admin.CoreV1().Secrets(namespace).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		StringData: map[string]string{"agent-token": gwAgentToken},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.admin.CoreV1().Secrets(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return map[string]string{
		"CONCLAVE_RUNNER_GATEWAY_ADDR":              gwAddr,
		"CONCLAVE_RUNNER_HOST_GATEWAY_ADDR":         fwd.Addr().String(),
		"CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET": name,
		"CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_KEY":    "agent-token",
		"CONCLAVE_RUNNER_SERVER_ID":                 "kubetest",
	}
}

// A Job's agent on the gateway is registered by its own agent-host, from
// its pod, not by the runner: the gateway lists it as running in its pod,
// and a coven SendMessage through the gateway's client API is answered by
// the agent in its pod, as a turn the runner records.
func TestAgentHostOnGateway(t *testing.T) {
	skipShort(t)
	gwAddr := startGateway(t)
	r := newRunnerState(t, freeLoopbackAddr(t), gatewayForPods(t, gwAddr)).run(t, nil)
	gw := gatewayClient(t, gwAddr)
	in := r.Launch(t, "on-gateway", workspace(t), nil)
	t.Cleanup(func() {
		// t.Context() has ended by now.
		if code := r.Do(t, "DELETE", "/api/v1/agents/"+in.ID, nil, nil); code != http.StatusOK {
			t.Errorf("delete %s: HTTP %d", in.ID, code)
		}
	})

	var agent *gatewayv1.Agent
	testenv.EventuallyNoError(t, waitTimeout, "the Job's agent on the gateway", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		a, err := gw.GetAgent(gwAuthed(ctx), &gatewayv1.GetAgentRequest{AgentId: in.ID})
		if err != nil {
			return err
		}
		agent = a.GetAgent()
		return nil
	})
	job := r.Status(t, in.ID).ContainerID
	// Its pod's name is its Job's, and a suffix.
	if host := agent.GetMetadata().GetHostname(); !strings.HasPrefix(host, job+"-") {
		t.Errorf("the agent runs on %q, want a pod of its Job %s", host, job)
	}
	if tags := agent.GetMetadata().GetWorkspaces(); !slices.Equal(tags, []string{"runner", "instance:" + in.ID, "agent_type:on-gateway"}) {
		t.Errorf("tags %v", tags)
	}
	// agent-host registered it, and said so in the instance's log; the
	// runner did not register it too.
	for _, l := range r.WaitLog(t, in.ID, "agent-host: registered at the gateway as coven agent "+in.ID) {
		if strings.HasPrefix(l.Text, "registered at the gateway") {
			t.Errorf("the runner registered the Job's agent itself: %q", l.Text)
		}
	}

	ctx, cancel := context.WithTimeout(gwAuthed(t.Context()), waitTimeout)
	defer cancel()
	st, err := gw.SendMessage(ctx, &gatewayv1.SendMessageRequest{AgentId: in.ID, Content: "hello from the front door"})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for done := false; !done; {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("the stream ended before the request did: %v (events %v)", err, kinds)
		}
		switch ev := m.GetEvent().GetEvent().(type) {
		case *covenpb.MessageResponse_Text:
			kinds = append(kinds, "text")
		case *covenpb.MessageResponse_ToolUse:
			kinds = append(kinds, "tool_use")
		case *covenpb.MessageResponse_Done:
			if !strings.Contains(ev.Done.GetFullResponse(), "Working on: hello from the front door") {
				t.Errorf("answered %q", ev.Done.GetFullResponse())
			}
			done = true
		case *covenpb.MessageResponse_Error:
			t.Fatalf("error %q after %v", ev.Error, kinds)
		case *covenpb.MessageResponse_Cancelled:
			t.Fatalf("cancelled after %v", kinds)
		}
	}
	if !slices.Contains(kinds, "text") || !slices.Contains(kinds, "tool_use") {
		t.Errorf("events %v, want text and tool_use before done", kinds)
	}
	// The runner stored the message as the instance's turn.
	r.WaitStatus(t, in.ID, "completed")
	r.WaitLog(t, in.ID, "gateway request")
}

func gatewayClient(t *testing.T, gwAddr string) gatewayv1.GatewayServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(gwAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return gatewayv1.NewGatewayServiceClient(conn)
}

func gwAuthed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gwClientToken)
}

// TestHundredGatewayAgents launches 100 agents at once, each in its own
// Job's pod on the node, with gateway: true: each one's agent-host
// registers it at the gateway, which lists all 100, and a message sent to
// each at once is answered by its agent in its pod.
func TestHundredGatewayAgents(t *testing.T) {
	skipShort(t)
	const n = 100
	gwAddr := startGateway(t)
	settings := gatewayForPods(t, gwAddr)
	settings["CONCLAVE_RUNNER_WORKERS"] = "120" // each live agent holds a worker
	r := newRunnerState(t, freeLoopbackAddr(t), settings).run(t, nil)
	gw := gatewayClient(t, gwAddr)
	authed := gwAuthed

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
	var listed map[string]*gatewayv1.Agent
	testenv.EventuallyNoError(t, 10*time.Minute, fmt.Sprintf("the gateway to list all %d agents", n), func() error {
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
		if missing > 0 {
			return fmt.Errorf("the gateway lists %d of the %d agents (%v)", n-missing, n, err)
		}
		return nil
	})
	for _, id := range ids {
		// Where it runs is its pod, not the runner replica.
		if host := listed[id].GetMetadata().GetHostname(); host == "" || host == "kubetest" {
			t.Errorf("agent %s runs on %q, want its pod", id, host)
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
