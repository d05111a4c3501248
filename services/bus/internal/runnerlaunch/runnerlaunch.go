// Package runnerlaunch is the default handler's Launcher over the runner's
// gRPC API (conclave.runner.v1.RunnerService.LaunchAgent). The bus and the
// runner share only the contract in proto/.
package runnerlaunch

import (
	"context"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// Launcher asks the runner to launch one agent of a fixed type per unrouted
// topic.
type Launcher struct {
	client    runnerv1.RunnerServiceClient
	target    string
	agentType string
	token     string
}

// New returns a Launcher over conn, a connection to the runner's gRPC
// listener at target (named in errors). token, when set, is sent as a
// bearer token on every call.
func New(conn grpc.ClientConnInterface, target, agentType, token string) *Launcher {
	return &Launcher{client: runnerv1.NewRunnerServiceClient(conn), target: target, agentType: agentType, token: token}
}

// Launch asks for an agent with the bub protocol's four variables and BUB_TOKEN,
// its bus token (the runner's Kubernetes executor puts every *_TOKEN
// variable in the launch's Secret, not the Job spec). The agent id is also
// the task id, so that the runner's task names the agent the bus waits
// for.
func (l *Launcher) Launch(ctx context.Context, req broker.LaunchRequest) error {
	if l.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+l.token)
	}
	md, err := structpb.NewStruct(map[string]any{"bus_topic": req.DefaultTopic, "bus_agent_id": req.AgentID})
	if err != nil {
		return fmt.Errorf("launch metadata: %w", err)
	}
	env := map[string]string{
		"BUB_WORKSPACE":     req.Workspace,
		"BUB_DEFAULT_TOPIC": req.DefaultTopic,
		"BUB_AGENT_ID":      req.AgentID,
		"BUB_BUS_URL":       req.BusURL,
	}
	if req.Token != "" {
		env["BUB_TOKEN"] = req.Token
	}
	_, err = l.client.LaunchAgent(ctx, &runnerv1.LaunchAgentRequest{
		TaskId: req.AgentID, AgentType: l.agentType, WorkspacePath: req.Workspace,
		Env: env, Metadata: md,
	})
	if err != nil {
		return l.describe(err)
	}
	return nil
}

// Error is a launch the runner refused or could not be asked for. Its
// message says what happened in the bus's terms and names the setting to
// look at; the publisher's ack and the dead letter carry it.
type Error struct {
	Code   codes.Code // the gRPC status code of the runner's answer
	Reason string     // the runner's REST error code (validation_error, ...), when it gave one
	msg    string
	err    error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

func (l *Launcher) describe(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("the runner at %s: %w", l.target, err)
	}
	e := &Error{Code: st.Code(), err: err}
	details := ""
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			e.Reason = info.GetReason()
			details = info.GetMetadata()["details"]
		}
	}
	message := st.Message()
	if details != "" {
		message += " (" + details + ")"
	}
	switch st.Code() {
	case codes.Unavailable:
		e.msg = fmt.Sprintf("the runner at %s (CONCLAVE_BUS_RUNNER_ADDR) is unreachable: %s", l.target, st.Message())
	case codes.DeadlineExceeded:
		e.msg = fmt.Sprintf("the runner at %s did not answer the launch in time (CONCLAVE_BUS_SPAWN_TIMEOUT): %s", l.target, st.Message())
	case codes.Unauthenticated, codes.PermissionDenied:
		e.msg = fmt.Sprintf("the runner at %s refused the bus's token (CONCLAVE_BUS_RUNNER_TOKEN): %s", l.target, st.Message())
	case codes.InvalidArgument:
		e.msg = fmt.Sprintf("the runner rejected the launch of agent type %q: %s", l.agentType, message)
	case codes.ResourceExhausted:
		e.msg = fmt.Sprintf("the runner at %s is rate limiting the bus: %s", l.target, message)
	default:
		e.msg = fmt.Sprintf("the runner at %s failed the launch (%s): %s", l.target, st.Code(), message)
	}
	if e.Reason != "" {
		e.msg += " [" + e.Reason + "]"
	}
	return e
}
