// Package api serves conclave.runner.v1.RunnerService, and its REST form
// with Kandev's paths, JSON and error bodies (docs/runner.md).
package api

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/conclave-ai/conclave/pkg/ids"
	"github.com/conclave-ai/conclave/pkg/server"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
	"github.com/conclave-ai/conclave/services/runner/internal/supervisor"
)

// ServicePrefix is the gRPC service's full-method prefix, for auth.
const ServicePrefix = "/conclave.runner.v1.RunnerService/"

// Limits bound what a client may send.
type Limits struct {
	// MaxEnvBytes bounds a launch's env, keys and values together.
	MaxEnvBytes int
	MaxEnvVars  int
	// MaxPromptBytes bounds a prompt.
	MaxPromptBytes int
	// MaxTail bounds logs?tail=; DefaultTail is used for 0.
	MaxTail, DefaultTail int
}

// DefaultLimits are the runner's.
var DefaultLimits = Limits{MaxEnvBytes: 64 << 10, MaxEnvVars: 128, MaxPromptBytes: 256 << 10, MaxTail: 10000, DefaultTail: 100}

// Server implements RunnerService.
type Server struct {
	runnerv1.UnimplementedRunnerServiceServer
	rec      *records.Records
	registry *agenttype.Registry
	sup      *supervisor.Supervisor
	confine  func(workspacePath string) (string, error)
	limits   Limits
	// owners reaches the replicas running other instances' agents.
	owners *Owners
	// executor names the executor agents start on ("local",
	// "kubernetes"); empty, launches are not checked against it.
	executor string
}

// WithExecutor makes the API refuse a launch of a type that executor
// cannot start (agenttype.Type.RunnableOn), rather than accept it and
// fail it a moment later.
func (s *Server) WithExecutor(name string) *Server {
	s.executor = name
	return s
}

// New returns the API over the runner's parts; owners forwards calls for
// instances whose agents other replicas run.
func New(rec *records.Records, registry *agenttype.Registry, sup *supervisor.Supervisor, confine func(workspacePath string) (string, error), limits Limits, owners *Owners) *Server {
	return &Server{rec: rec, registry: registry, sup: sup, confine: confine, limits: limits, owners: owners}
}

// Kandev's error codes, carried as the reason of an ErrorInfo detail so
// that the REST error body can name them.
const (
	CodeBadRequest = "bad_request"
	CodeNotFound   = "not_found"
	CodeValidation = "validation_error"
	CodeInternal   = "internal_error"
	// CodeUnavailable (503): the instance's runner cannot be reached now;
	// the same request succeeds once its launch has moved on.
	CodeUnavailable = "unavailable"
	// The request itself, beyond Kandev's common codes: a wrong method
	// (405), a body over the limit (413) or not JSON (415), too many
	// requests (429).
	CodeMethodNotAllowed     = "method_not_allowed"
	CodePayloadTooLarge      = "payload_too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeRateLimited          = "rate_limited"
)

// apiError is a gRPC status with Kandev's code and details.
func apiError(c codes.Code, code, message, details string) error {
	st := status.New(c, message)
	info := &errdetails.ErrorInfo{Reason: code, Domain: "runner.conclave"}
	if details != "" {
		info.Metadata = map[string]string{"details": details}
	}
	if withDetails, err := st.WithDetails(info); err == nil {
		st = withDetails
	}
	return st.Err()
}

func validation(message, details string) error {
	return apiError(codes.InvalidArgument, CodeValidation, message, details)
}

func notFound(what string) error {
	return apiError(codes.NotFound, CodeNotFound, what+" not found", "")
}

// internal is an error the client is told nothing more of: its cause (a
// store's error may name keys or the caller's input) goes to the log.
func internal(err error) error {
	return server.Hide(status.Convert(apiError(codes.Internal, CodeInternal, "internal error", "")), err)
}

func fromRecords(err error, what string) error {
	if errors.Is(err, records.ErrNotFound) {
		return notFound(what)
	}
	return internal(err)
}

func fromSupervisor(err error, what string) error {
	switch {
	case errors.Is(err, records.ErrNotFound):
		return notFound(what)
	case errors.Is(err, supervisor.ErrBusy):
		return apiError(codes.FailedPrecondition, CodeBadRequest, "the instance cannot take this now", err.Error())
	case errors.Is(err, supervisor.ErrFinished):
		return apiError(codes.FailedPrecondition, CodeBadRequest, "the instance has finished", err.Error())
	}
	if elsewhere := (*supervisor.ErrElsewhere)(nil); errors.As(err, &elsewhere) {
		// Met only by a forwarded call, which is not forwarded again: the
		// instance moved on between the forwarder's read and this one.
		return apiError(codes.Unavailable, CodeUnavailable, "the instance runs on another runner replica; retry", err.Error())
	}
	return internal(err)
}

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// agentTypeFilter bounds ListAgents' agent_type, a segment of the
// listing's store keys, as ids are.
var agentTypeFilter = ids.Kind{Field: "agent_type", MaxBytes: ids.MaxBytes, Forbidden: "/#"}

// checkID applies kind's rule (pkg/ids): a refused id is a
// validation_error naming the field, before any store call.
func checkID(kind ids.Kind, id string) error {
	if err := kind.Check(id); err != nil {
		return validation(err.Error(), fmt.Sprintf("%s is 1 to %d bytes of UTF-8, without spaces, control or format characters, %s", kind.Field, kind.MaxBytes, quoteAll(kind.Forbidden)))
	}
	return nil
}

func quoteAll(chars string) string {
	q := make([]string, 0, len(chars))
	for _, c := range chars {
		q = append(q, fmt.Sprintf("%q", c))
	}
	return strings.Join(q, " or ")
}

// LaunchAgent validates the launch, writes the instance and its task, and
// queues it; a worker starts it. An invalid launch creates nothing.
func (s *Server) LaunchAgent(ctx context.Context, req *runnerv1.LaunchAgentRequest) (*runnerv1.LaunchAgentResponse, error) {
	if err := checkID(ids.TaskID, req.GetTaskId()); err != nil {
		return nil, err
	}
	typ, ok := s.registry.Get(req.GetAgentType())
	if !ok {
		return nil, validation(fmt.Sprintf("unknown agent_type %q", req.GetAgentType()), "GET /api/v1/agent-types lists them")
	}
	if !typ.Enabled {
		return nil, validation(fmt.Sprintf("agent_type %q is disabled", typ.ID), "its entry in the runner's agent types file (CONCLAVE_RUNNER_AGENT_TYPES) says enabled: false")
	}
	if s.executor != "" {
		if err := typ.RunnableOn(s.executor); err != nil {
			return nil, validation(err.Error(), "the runner's agent types file (CONCLAVE_RUNNER_AGENT_TYPES) gives a type its command and image; GET /api/v1/agent-types lists the types")
		}
	}
	if p := req.GetPriority(); p < 0 || p > supervisor.MaxPriority {
		return nil, validation(fmt.Sprintf("priority %d is outside 0 to %d", p, supervisor.MaxPriority), "a higher priority starts before lower ones while workers are busy; 0 is the default")
	}
	if len(req.GetEnv()) > s.limits.MaxEnvVars {
		return nil, validation(fmt.Sprintf("env has %d variables, at most %d", len(req.GetEnv()), s.limits.MaxEnvVars), "")
	}
	size := 0
	for k, v := range req.GetEnv() {
		if !agenttype.ValidEnvName(k) {
			return nil, validation(fmt.Sprintf("env variable name %q is not valid", k), "names are letters, digits and '_', not starting with a digit")
		}
		if k == "TRACEPARENT" {
			return nil, validation("env may not set TRACEPARENT", "the runner sets it to the launch's trace")
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, validation(fmt.Sprintf("env variable %s contains a NUL byte", k), "")
		}
		size += len(k) + len(v)
	}
	if size > s.limits.MaxEnvBytes {
		return nil, validation(fmt.Sprintf("env is %d bytes, over the %d byte limit", size, s.limits.MaxEnvBytes), "")
	}
	// Only what the operator lets callers set reaches the agent, and never
	// a variable that hooks its loader, shell or interpreter.
	if envErr := (*agenttype.EnvError)(nil); errors.As(typ.CheckLaunchEnv(req.GetEnv()), &envErr) {
		if envErr.Hook {
			return nil, validation(fmt.Sprintf("env may not set %s", envErr.Name),
				"it can make the agent's loader, shell, interpreter or tools run code, or it is the platform's own; only the operator can set it, in the agent type's env")
		}
		return nil, validation(fmt.Sprintf("env variable %s is not allowed for agent type %s", envErr.Name, typ.ID),
			"a launch may set only "+strings.Join(envErr.Allowed, ", ")+" (the type's required_env and launch_env)")
	}
	if missing := typ.MissingEnv(req.GetEnv()); missing != "" {
		return nil, validation(fmt.Sprintf("required environment variable %s is missing", missing), fmt.Sprintf("agent type %s requires %s", typ.ID, strings.Join(typ.RequiredEnv, ", ")))
	}
	workspace, err := s.confine(req.GetWorkspacePath())
	if err != nil {
		return nil, validation("workspace_path is not allowed", err.Error())
	}
	now := time.Now().UTC()
	in := &records.Instance{
		ID: newID(), TaskID: req.GetTaskId(), AgentType: typ.ID, Status: records.StatusStarting,
		StartedAt: now, Workspace: workspace, Priority: int(req.GetPriority()),
		Env: maps.Clone(req.GetEnv()), LaunchSeq: 1,
	}
	if md := req.GetMetadata(); md != nil {
		in.Metadata = md.AsMap()
		if err := checkGatewayMetadata(in.Metadata); err != nil {
			return nil, err
		}
		// A launch may name a session to resume (Kandev's API passes the id of
		// a previous task's session).
		if id, ok := in.Metadata["session_id"].(string); ok {
			in.SessionID = id
		}
	}
	if id := req.GetEnv()["AUGGIE_SESSION_ID"]; id != "" && in.SessionID == "" {
		in.SessionID = id
	}
	// The first turn: TASK_DESCRIPTION, if given, is the first prompt; a
	// legacy agent's whole run is its one turn.
	if in.Prompt = req.GetEnv()["TASK_DESCRIPTION"]; in.Prompt != "" || typ.Protocol == acp.DialectLegacy {
		in.Turn = 1
	}
	// The instance, its task and the launch message all at once: the
	// embedded store commits the two writes together, beside the queue's
	// commit.
	err = s.sup.Launch(ctx, in, func(ctx context.Context) error {
		taskErr := make(chan error, 1)
		go func() {
			_, err := s.rec.UpdateTask(ctx, in.TaskID, func(t *records.Task) {
				t.AgentType, t.Status = typ.ID, records.StatusStarting
				t.InstanceIDs = append(t.InstanceIDs, in.ID)
				if t.Metadata == nil {
					t.Metadata = map[string]any{}
				}
				maps.Copy(t.Metadata, in.Metadata)
			})
			taskErr <- err
		}()
		err := s.rec.CreateInstance(ctx, in)
		if terr := <-taskErr; err == nil {
			err = terr
		}
		return err
	})
	if err != nil {
		return nil, internal(err)
	}
	return &runnerv1.LaunchAgentResponse{Instance: instanceProto(in)}, nil
}

func instanceProto(in *records.Instance) *runnerv1.AgentInstance {
	out := &runnerv1.AgentInstance{
		Id: in.ID, TaskId: in.TaskID, AgentType: in.AgentType, ContainerId: in.ContainerID,
		Status: in.Status, StartedAt: timestamppb.New(in.StartedAt), Progress: int32(in.Progress),
	}
	if in.Approval != nil && in.Status == records.StatusAwaitingApproval {
		out.ReviewUrl = in.Approval.ReviewURL
	}
	if !in.FinishedAt.IsZero() {
		out.FinishedAt = timestamppb.New(in.FinishedAt)
	}
	if in.Status == records.StatusFailed {
		out.Error = in.Error
	}
	return out
}

func (s *Server) PromptAgent(ctx context.Context, req *runnerv1.PromptAgentRequest) (*runnerv1.PromptAgentResponse, error) {
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return nil, err
	}
	switch msg := req.GetMessage(); {
	case strings.TrimSpace(msg) == "":
		return nil, validation("message is required", "")
	case len(msg) > s.limits.MaxPromptBytes:
		return nil, validation(fmt.Sprintf("message is %d bytes, over the %d byte limit", len(msg), s.limits.MaxPromptBytes), "")
	}
	err := s.sup.Prompt(ctx, req.GetInstanceId(), req.GetMessage())
	if owner, ok := s.elsewhere(ctx, err); ok {
		resp, err := forward(ctx, s.owners, ForwardPrompt, owner, func(ctx context.Context, c runnerv1.RunnerServiceClient) (*runnerv1.PromptAgentResponse, error) {
			return c.PromptAgent(ctx, req)
		})
		if unreachable := (*unreachableError)(nil); errors.As(err, &unreachable) {
			// Not stored, so not accepted: the caller must know to retry.
			return nil, apiError(codes.Unavailable, CodeUnavailable, "the instance's runner is unreachable; retry the prompt",
				unreachable.Error()+"; another runner takes the instance's launch over within CONCLAVE_RUNNER_LAUNCH_RETRY, and then takes prompts")
		}
		return resp, err
	}
	if err != nil {
		return nil, fromSupervisor(err, "instance "+req.GetInstanceId())
	}
	return &runnerv1.PromptAgentResponse{Accepted: true}, nil
}

func (s *Server) CancelAgent(ctx context.Context, req *runnerv1.CancelAgentRequest) (*runnerv1.CancelAgentResponse, error) {
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return nil, err
	}
	if len(req.GetReason()) > 4096 {
		return nil, validation("reason is over 4096 bytes", "")
	}
	in, err := s.sup.Cancel(ctx, req.GetInstanceId(), req.GetReason())
	if owner, ok := s.elsewhere(ctx, err); ok {
		return s.forwardCancel(ctx, req, owner)
	}
	if err != nil {
		return nil, fromSupervisor(err, "instance "+req.GetInstanceId())
	}
	return &runnerv1.CancelAgentResponse{Id: in.ID, Status: in.Status}, nil
}

func (s *Server) GetAgentStatus(ctx context.Context, req *runnerv1.GetAgentStatusRequest) (*runnerv1.GetAgentStatusResponse, error) {
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return nil, err
	}
	in, err := s.rec.Instance(ctx, req.GetInstanceId())
	if err != nil {
		return nil, fromRecords(err, "instance "+req.GetInstanceId())
	}
	if in.Deleted {
		return nil, notFound("instance " + req.GetInstanceId())
	}
	return &runnerv1.GetAgentStatusResponse{Instance: instanceProto(in)}, nil
}

func (s *Server) tail(requested int32) (int, error) {
	n := int(requested)
	switch {
	case n < 0:
		return 0, validation("tail must not be negative", "")
	case n == 0:
		n = s.limits.DefaultTail
	case n > s.limits.MaxTail:
		return 0, validation(fmt.Sprintf("tail is at most %d", s.limits.MaxTail), "")
	}
	return n, nil
}

func logProto(l records.LogLine) *runnerv1.LogLine {
	return &runnerv1.LogLine{Time: timestamppb.New(l.Time), Stream: l.Stream, Text: l.Text}
}

func (s *Server) GetAgentLogs(ctx context.Context, req *runnerv1.GetAgentLogsRequest) (*runnerv1.GetAgentLogsResponse, error) {
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return nil, err
	}
	if req.GetFollow() {
		return nil, validation("follow=true streams: use FollowAgentLogs (REST: GET .../logs?follow=true)", "")
	}
	n, err := s.tail(req.GetTail())
	if err != nil {
		return nil, err
	}
	if _, err := s.rec.Instance(ctx, req.GetInstanceId()); err != nil {
		return nil, fromRecords(err, "instance "+req.GetInstanceId())
	}
	lines, _, err := s.rec.TailLogs(ctx, req.GetInstanceId(), n)
	if err != nil {
		return nil, internal(err)
	}
	out := &runnerv1.GetAgentLogsResponse{InstanceId: req.GetInstanceId()}
	for _, l := range lines {
		out.Lines = append(out.Lines, logProto(l))
	}
	return out, nil
}

func (s *Server) GetAgentSession(ctx context.Context, req *runnerv1.GetAgentSessionRequest) (*runnerv1.GetAgentSessionResponse, error) {
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return nil, err
	}
	in, err := s.rec.Instance(ctx, req.GetInstanceId())
	if err != nil {
		return nil, fromRecords(err, "instance "+req.GetInstanceId())
	}
	return &runnerv1.GetAgentSessionResponse{InstanceId: in.ID, TaskId: in.TaskID, SessionId: in.SessionID, Status: in.Status}, nil
}

func (s *Server) GetTask(ctx context.Context, req *runnerv1.GetTaskRequest) (*runnerv1.GetTaskResponse, error) {
	if err := checkID(ids.TaskID, req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.rec.Task(ctx, req.GetTaskId())
	if err != nil {
		return nil, fromRecords(err, "task "+req.GetTaskId())
	}
	out := &runnerv1.Task{Id: t.ID, Status: t.Status, AgentType: t.AgentType, InstanceIds: t.InstanceIDs,
		CreatedAt: timestamppb.New(t.CreatedAt), UpdatedAt: timestamppb.New(t.UpdatedAt)}
	if len(t.InstanceIDs) > 0 {
		// The task's status is its latest instance's.
		if in, err := s.rec.Instance(ctx, t.InstanceIDs[len(t.InstanceIDs)-1]); err == nil {
			out.Status = in.Status
		}
	}
	// Always an object, as Kandev's API reads it (metadata.auggie_session_id),
	// even before anything is in it.
	md, err := structpb.NewStruct(t.Metadata)
	if err != nil {
		return nil, internal(err)
	}
	out.Metadata = md
	return &runnerv1.GetTaskResponse{Task: out}, nil
}

func (s *Server) DeleteAgent(ctx context.Context, req *runnerv1.DeleteAgentRequest) (*runnerv1.DeleteAgentResponse, error) {
	if err := checkID(ids.InstanceID, req.GetInstanceId()); err != nil {
		return nil, err
	}
	if !forwarded(ctx) {
		// Asked of the owner, so that its agent is killed now rather than
		// at its next write.
		if in, err := s.rec.Instance(ctx, req.GetInstanceId()); err == nil && !in.Deleted {
			if owner := s.sup.RemoteOwner(in); owner != "" {
				resp, err := forward(ctx, s.owners, ForwardDelete, owner, func(ctx context.Context, c runnerv1.RunnerServiceClient) (*runnerv1.DeleteAgentResponse, error) {
					return c.DeleteAgent(ctx, req)
				})
				if !errors.As(err, new(*unreachableError)) {
					return resp, err
				}
				// The owner is gone: deleted here, its redelivered launch
				// finds no instance and is dropped.
			}
		}
	}
	if err := s.sup.Delete(ctx, req.GetInstanceId()); err != nil {
		return nil, fromSupervisor(err, "instance "+req.GetInstanceId())
	}
	return &runnerv1.DeleteAgentResponse{Id: req.GetInstanceId(), Deleted: true}, nil
}

func (s *Server) ListAgentTypes(context.Context, *runnerv1.ListAgentTypesRequest) (*runnerv1.ListAgentTypesResponse, error) {
	out := &runnerv1.ListAgentTypesResponse{}
	for _, t := range s.registry.List() {
		out.AgentTypes = append(out.AgentTypes, &runnerv1.AgentType{
			Id: t.ID, Name: t.Name, Description: t.Description, Image: t.Image, Command: t.Command,
			WorkingDir: t.WorkingDir, MemoryMb: int32(t.MemoryMB), CpuCores: t.CPUCores,
			Timeout: t.EffectiveTimeout().String(), Capabilities: t.Capabilities, RequiredEnv: t.RequiredEnv,
			Protocol: t.Protocol, Enabled: t.Enabled, LaunchEnv: t.LaunchEnv,
		})
	}
	return out, nil
}

// Page sizes of ListAgents.
const (
	DefaultListPageSize = 50
	MaxListPageSize     = 200
)

// listToken is ListAgents' page token: where the listing got to, and the
// filters it was asked with (a token is only good with the same ones).
type listToken struct {
	After     string `json:"a"`
	Status    string `json:"s,omitempty"`
	AgentType string `json:"t,omitempty"`
}

func (t listToken) encode() string {
	data, _ := json.Marshal(t)
	return base64.RawURLEncoding.EncodeToString(data)
}

// decodeListToken parses a token from a client, trusting nothing about it.
func decodeListToken(s string) (listToken, bool) {
	var t listToken
	if len(s) > 1024 {
		return t, false
	}
	data, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(data, &t) != nil || !records.ValidListPosition(t.After) {
		return t, false
	}
	return t, true
}

var listStatuses = []string{records.StatusStarting, records.StatusRunning, records.StatusAwaitingApproval, records.StatusCompleted, records.StatusFailed, records.StatusStopped}

// ListAgents lists instances, newest launch first. Every client that may
// read an instance's status may read them all (the runner's tokens are not
// scoped to instances), so it lists every instance.
func (s *Server) ListAgents(ctx context.Context, req *runnerv1.ListAgentsRequest) (*runnerv1.ListAgentsResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0 || size > MaxListPageSize:
		return nil, validation(fmt.Sprintf("page_size %d is outside 0 to %d", size, MaxListPageSize), fmt.Sprintf("0 means %d", DefaultListPageSize))
	case size == 0:
		size = DefaultListPageSize
	}
	if st := req.GetStatus(); st != "" && !slices.Contains(listStatuses, st) {
		return nil, validation(fmt.Sprintf("unknown status %q", st), "one of "+strings.Join(listStatuses, ", "))
	}
	if t := req.GetAgentType(); t != "" {
		if err := checkID(agentTypeFilter, t); err != nil {
			return nil, err
		}
	}
	opts := records.ListOptions{Status: req.GetStatus(), AgentType: req.GetAgentType(), Limit: size}
	if req.GetPageToken() != "" {
		tok, ok := decodeListToken(req.GetPageToken())
		if !ok {
			return nil, validation("page_token is malformed", "pass next_page_token from a previous response, unchanged")
		}
		if tok.Status != opts.Status || tok.AgentType != opts.AgentType {
			return nil, validation("page_token was given for other filters", "pass the same status and agent_type as the request that returned it")
		}
		opts.After = tok.After
	}
	page, err := s.rec.ListInstances(ctx, opts)
	if err != nil {
		return nil, internal(err)
	}
	out := &runnerv1.ListAgentsResponse{Instances: make([]*runnerv1.AgentInstance, 0, len(page.Instances))}
	for _, in := range page.Instances {
		out.Instances = append(out.Instances, instanceProto(in))
	}
	if page.Next != "" {
		out.NextPageToken = listToken{After: page.Next, Status: opts.Status, AgentType: opts.AgentType}.encode()
	}
	return out, nil
}

// checkGatewayMetadata checks what a launch's metadata says of the
// gateway: gateway is a bool, gateway_agent_id an agent_id the gateway
// accepts.
func checkGatewayMetadata(md map[string]any) error {
	if v, ok := md[supervisor.MetadataGateway]; ok {
		if _, isBool := v.(bool); !isBool {
			return validation("metadata.gateway must be true or false", "true registers the instance at the gateway as a coven agent")
		}
	}
	if v, ok := md[supervisor.MetadataGatewayAgentID]; ok {
		id, isString := v.(string)
		if !isString {
			return validation("metadata.gateway_agent_id must be a string", "the agent_id the instance registers under at the gateway")
		}
		if err := ids.AgentID.Check(id); err != nil {
			return validation("metadata.gateway_agent_id: "+err.Error(), "the agent_id the instance registers under at the gateway")
		}
	}
	return nil
}
