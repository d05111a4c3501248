package runnerlaunch

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// runner answers LaunchAgent with a fixed error, or records the request.
type runner struct {
	runnerv1.UnimplementedRunnerServiceServer
	fail  error
	got   *runnerv1.LaunchAgentRequest
	token string
}

func (r *runner) LaunchAgent(ctx context.Context, req *runnerv1.LaunchAgentRequest) (*runnerv1.LaunchAgentResponse, error) {
	if r.fail != nil {
		return nil, r.fail
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 {
		r.token = v[0]
	}
	r.got = req
	return &runnerv1.LaunchAgentResponse{Instance: &runnerv1.AgentInstance{Id: "i-1", Status: "starting"}}, nil
}

func serve(t *testing.T, r *runner) *Launcher {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runnerv1.RegisterRunnerServiceServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return New(conn, l.Addr().String(), "bub-agent", "secret-token")
}

var req = broker.LaunchRequest{AgentID: "agent-1", Workspace: "/ws", DefaultTopic: "tg:1", BusURL: "ws://127.0.0.1:7892", Token: "bub_agent-token"}

func TestLaunchSendsTheBubEnvironment(t *testing.T) {
	t.Parallel()
	r := &runner{}
	if err := serve(t, r).Launch(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"BUB_WORKSPACE": "/ws", "BUB_DEFAULT_TOPIC": "tg:1", "BUB_AGENT_ID": "agent-1", "BUB_BUS_URL": "ws://127.0.0.1:7892",
		"BUB_TOKEN": "bub_agent-token"}
	for k, v := range want {
		if r.got.GetEnv()[k] != v {
			t.Errorf("env %s = %q, want %q", k, r.got.GetEnv()[k], v)
		}
	}
	if r.got.GetTaskId() != "agent-1" || r.got.GetAgentType() != "bub-agent" || r.got.GetWorkspacePath() != "/ws" {
		t.Errorf("launch %v", r.got)
	}
	if r.token != "Bearer secret-token" {
		t.Errorf("authorization %q", r.token)
	}
}

func TestRunnerErrorsAreNamed(t *testing.T) {
	t.Parallel()
	validation, _ := status.New(codes.InvalidArgument, `unknown agent_type "bub-agent"`).WithDetails(
		&errdetails.ErrorInfo{Reason: "validation_error", Metadata: map[string]string{"details": "GET /api/v1/agent-types lists them"}})
	for _, tt := range []struct {
		name string
		fail error
		want []string
	}{
		{"validation", validation.Err(), []string{`rejected the launch of agent type "bub-agent"`, "unknown agent_type", "GET /api/v1/agent-types lists them", "[validation_error]"}},
		{"token", status.Error(codes.Unauthenticated, "missing bearer token"), []string{"refused the bus's token (CONCLAVE_BUS_RUNNER_TOKEN)"}},
		{"rate", status.Error(codes.ResourceExhausted, "slow down"), []string{"rate limiting the bus"}},
		{"internal", status.Error(codes.Internal, "disk full"), []string{"failed the launch (Internal): disk full"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := serve(t, &runner{fail: tt.fail}).Launch(context.Background(), req)
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v lacks %q", err, w)
				}
			}
		})
	}
}
