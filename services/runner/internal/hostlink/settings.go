package hostlink

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

// EnvPrefix starts every agent-host setting; the agent gets none of them.
const EnvPrefix = "CONCLAVE_AGENT_HOST_"

// Settings are agent-host's settings (pkg/config tags: each comes from its
// environment variable or a flag).
type Settings struct {
	RunnerAddr string `env:"CONCLAVE_AGENT_HOST_RUNNER_ADDR" help:"host:port of the runner's gRPC listener (required)"`
	// Token is a secret: it is never logged, and the agent never sees it.
	Token      string `env:"CONCLAVE_AGENT_HOST_TOKEN" help:"the instance's token, hostlink.Token of the instance id under the runner's key (required; secret)"`
	InstanceID string `env:"CONCLAVE_AGENT_HOST_INSTANCE_ID" help:"the instance (required)"`
	Launch     int64  `env:"CONCLAVE_AGENT_HOST_LAUNCH" help:"the instance's launch number (required, at least 1)"`
	Protocol   string `env:"CONCLAVE_AGENT_HOST_PROTOCOL" help:"the agent's dialect: acp, kandev, legacy, or empty to detect"`
	SessionID  string `env:"CONCLAVE_AGENT_HOST_SESSION_ID" help:"a session to resume with session/load (empty: session/new)"`
	Permission string `env:"CONCLAVE_AGENT_HOST_PERMISSION" default:"deny" help:"how session/request_permission is answered: allow, deny, allow_always, or librarian (the runner decides each, asking the Librarian)"`
	AuthMethod string `env:"CONCLAVE_AGENT_HOST_AUTH_METHOD" help:"the ACP authMethods id to authenticate with before the session opens, when the agent offers authMethods (the agent type's auth_method)"`
	Workspace  string `env:"CONCLAVE_AGENT_HOST_WORKSPACE" help:"the agent's working directory, to which fs/* requests are confined (empty: the current directory, and fs/* refused)"`
	// LaunchEnv and LaunchEnvAllowed are set by the Kubernetes executor:
	// agent-host checks them again before it starts the agent, since the
	// Job's spec carries the env (agenttype.CheckLaunchVariable).
	LaunchEnv        []string `env:"CONCLAVE_AGENT_HOST_LAUNCH_ENV" help:"comma-separated names of the variables of this environment that the launch set (the others are the agent type's and the image's); the agent is not started if one is not allowed"`
	LaunchEnvAllowed []string `env:"CONCLAVE_AGENT_HOST_LAUNCH_ENV_ALLOWED" help:"comma-separated names and PREFIX* patterns a launch may set (the agent type's); a variable that hooks a loader, shell or interpreter is refused whatever this says"`

	// The coven gateway, when the launch asks for it: agent-host registers
	// the agent there itself (docs/runner-agents.md, "On the gateway").
	GatewayAddr string `env:"CONCLAVE_AGENT_HOST_GATEWAY_ADDR" help:"the coven gateway's AgentStream address (its Service, the load-balanced endpoint) to register the agent at; empty: the agent is not registered"`
	// GatewayToken is a secret: it is never logged, and the agent is not
	// started with it.
	GatewayToken        string        `env:"CONCLAVE_AGENT_HOST_GATEWAY_TOKEN" help:"bearer token presented to the gateway (secret; from the operator's Secret)"`
	GatewayAgentID      string        `env:"CONCLAVE_AGENT_HOST_GATEWAY_AGENT_ID" help:"the coven agent_id to register under (default: the instance id)"`
	GatewayName         string        `env:"CONCLAVE_AGENT_HOST_GATEWAY_NAME" help:"the agent's display name at the gateway (default: the agent_id)"`
	GatewayCapabilities []string      `env:"CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES" default:"chat" help:"comma-separated capabilities registered at the gateway (the agent type's)"`
	GatewayHeartbeat    time.Duration `env:"CONCLAVE_AGENT_HOST_GATEWAY_HEARTBEAT" default:"10s" help:"how often the agent's gateway stream sends a Heartbeat (0: never)"`
	AgentType           string        `env:"CONCLAVE_AGENT_HOST_AGENT_TYPE" help:"the instance's agent type, a tag of its registration at the gateway"`

	BufferBytes int `env:"CONCLAVE_AGENT_HOST_BUFFER_BYTES" default:"8388608" help:"bound on the bytes of events not yet acknowledged by the runner; when full, the agent's stdout is not read"`
	MaxLine     int `env:"CONCLAVE_AGENT_HOST_MAX_LINE" default:"4194304" help:"bound on a line from the agent (stdout and stderr)"`

	BackoffMin      time.Duration `env:"CONCLAVE_AGENT_HOST_BACKOFF_MIN" default:"200ms" help:"first wait before reconnecting to the runner"`
	BackoffMax      time.Duration `env:"CONCLAVE_AGENT_HOST_BACKOFF_MAX" default:"5s" help:"longest wait between reconnects"`
	GiveUp          time.Duration `env:"CONCLAVE_AGENT_HOST_GIVE_UP" default:"10m" help:"how long the runner may be unreachable (or not expect this launch) before the agent is killed and agent-host exits 69"`
	Heartbeat       time.Duration `env:"CONCLAVE_AGENT_HOST_HEARTBEAT" default:"10s" help:"heartbeat interval on the link; a link silent for three is dropped and redialled"`
	ProtocolTimeout time.Duration `env:"CONCLAVE_AGENT_HOST_PROTOCOL_TIMEOUT" default:"30s" help:"bound on the agent's answers to initialize and session/new or session/load"`
	KillGrace       time.Duration `env:"CONCLAVE_AGENT_HOST_KILL_GRACE" default:"10s" help:"how long the agent may take to exit after its stdin closes (or SIGTERM) before it is killed"`
}

// Validate names the environment key of a bad value.
func (s Settings) Validate() error {
	var errs []error
	need := func(key, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", key))
		}
	}
	need("CONCLAVE_AGENT_HOST_RUNNER_ADDR", s.RunnerAddr)
	need("CONCLAVE_AGENT_HOST_TOKEN", s.Token)
	need("CONCLAVE_AGENT_HOST_INSTANCE_ID", s.InstanceID)
	if s.InstanceID != "" && !validID(s.InstanceID, maxInstanceID) {
		errs = append(errs, errors.New("CONCLAVE_AGENT_HOST_INSTANCE_ID: 1-128 printable ASCII characters without spaces"))
	}
	if s.Launch < 1 {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_LAUNCH: must be at least 1, not %d", s.Launch))
	}
	switch s.Protocol {
	case "", acp.DialectACP, acp.DialectKandev, acp.DialectLegacy:
	default:
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_PROTOCOL: %q is not acp, kandev, legacy or empty", s.Protocol))
	}
	switch s.Permission {
	case "allow", "deny", "allow_always", acp.PermissionLibrarian:
	default:
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_PERMISSION: %q is not allow, deny, allow_always or librarian", s.Permission))
	}
	if s.Workspace != "" && !strings.HasPrefix(s.Workspace, "/") {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_WORKSPACE: %q is not an absolute path", s.Workspace))
	}
	errs = append(errs, s.validateGateway()...)
	if s.BufferBytes < 1<<10 {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_BUFFER_BYTES: must be at least 1024, not %d", s.BufferBytes))
	}
	if s.MaxLine < 1<<10 {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_MAX_LINE: must be at least 1024, not %d", s.MaxLine))
	}
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, not %s", key, d))
		}
	}
	positive("CONCLAVE_AGENT_HOST_BACKOFF_MIN", s.BackoffMin)
	positive("CONCLAVE_AGENT_HOST_GIVE_UP", s.GiveUp)
	positive("CONCLAVE_AGENT_HOST_PROTOCOL_TIMEOUT", s.ProtocolTimeout)
	positive("CONCLAVE_AGENT_HOST_KILL_GRACE", s.KillGrace)
	if s.BackoffMax < s.BackoffMin {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_BACKOFF_MAX: %s is below CONCLAVE_AGENT_HOST_BACKOFF_MIN %s", s.BackoffMax, s.BackoffMin))
	}
	if s.Heartbeat < minHeartbeat || s.Heartbeat > maxHeartbeat {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_HEARTBEAT: must be within %s and %s, not %s", minHeartbeat, maxHeartbeat, s.Heartbeat))
	}
	return errors.Join(errs...)
}

// Env renders the settings as agent-host's environment, for an executor
// that starts it: every setting but the tokens, which are secrets and go
// in CONCLAVE_AGENT_HOST_TOKEN and CONCLAVE_AGENT_HOST_GATEWAY_TOKEN by
// secret references. Zero values are left
// out (agent-host's defaults apply).
func (s Settings) Env() map[string]string {
	env := map[string]string{}
	set := func(key, v string) {
		if v != "" && v != "0" && v != "0s" {
			env[key] = v
		}
	}
	set("CONCLAVE_AGENT_HOST_RUNNER_ADDR", s.RunnerAddr)
	set("CONCLAVE_AGENT_HOST_INSTANCE_ID", s.InstanceID)
	set("CONCLAVE_AGENT_HOST_LAUNCH", strconv.FormatInt(s.Launch, 10))
	set("CONCLAVE_AGENT_HOST_PROTOCOL", s.Protocol)
	set("CONCLAVE_AGENT_HOST_SESSION_ID", s.SessionID)
	set("CONCLAVE_AGENT_HOST_PERMISSION", s.Permission)
	set("CONCLAVE_AGENT_HOST_AUTH_METHOD", s.AuthMethod)
	set("CONCLAVE_AGENT_HOST_WORKSPACE", s.Workspace)
	set("CONCLAVE_AGENT_HOST_GATEWAY_ADDR", s.GatewayAddr)
	set("CONCLAVE_AGENT_HOST_GATEWAY_AGENT_ID", s.GatewayAgentID)
	set("CONCLAVE_AGENT_HOST_GATEWAY_NAME", s.GatewayName)
	set("CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES", strings.Join(s.GatewayCapabilities, ","))
	set("CONCLAVE_AGENT_HOST_GATEWAY_HEARTBEAT", s.GatewayHeartbeat.String())
	set("CONCLAVE_AGENT_HOST_AGENT_TYPE", s.AgentType)
	set("CONCLAVE_AGENT_HOST_BUFFER_BYTES", strconv.Itoa(s.BufferBytes))
	set("CONCLAVE_AGENT_HOST_MAX_LINE", strconv.Itoa(s.MaxLine))
	set("CONCLAVE_AGENT_HOST_BACKOFF_MIN", s.BackoffMin.String())
	set("CONCLAVE_AGENT_HOST_BACKOFF_MAX", s.BackoffMax.String())
	set("CONCLAVE_AGENT_HOST_GIVE_UP", s.GiveUp.String())
	set("CONCLAVE_AGENT_HOST_HEARTBEAT", s.Heartbeat.String())
	set("CONCLAVE_AGENT_HOST_PROTOCOL_TIMEOUT", s.ProtocolTimeout.String())
	set("CONCLAVE_AGENT_HOST_KILL_GRACE", s.KillGrace.String())
	return env
}

// checkLaunchEnv is the runner's rule on a launch's env, applied again
// where the agent runs: each variable the launch set must be allowed, and
// none may hook the agent's loader, shell or interpreter.
func (s Settings) checkLaunchEnv() error {
	for _, name := range s.LaunchEnv {
		if err := agenttype.CheckLaunchVariable(s.LaunchEnvAllowed, name); err != nil {
			return err
		}
	}
	return nil
}

// AgentEnv is environ without agent-host's settings (the token above all):
// what the agent is started with.
func AgentEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, EnvPrefix) {
			out = append(out, kv)
		}
	}
	return out
}

// Bounds on what agent-host registers at the gateway.
const (
	maxGatewayName         = 256
	maxGatewayCapabilities = 32
	maxCapability          = 64
)

// validateGateway checks the gateway settings, when there is a gateway.
func (s Settings) validateGateway() []error {
	if s.GatewayAddr == "" {
		return nil
	}
	var errs []error
	if s.GatewayAgentID != "" && !validID(s.GatewayAgentID, maxInstanceID) {
		errs = append(errs, errors.New("CONCLAVE_AGENT_HOST_GATEWAY_AGENT_ID: 1-128 printable ASCII characters without spaces"))
	}
	if len(s.GatewayName) > maxGatewayName {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_GATEWAY_NAME: at most %d bytes", maxGatewayName))
	}
	if len(s.GatewayCapabilities) > maxGatewayCapabilities {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES: at most %d", maxGatewayCapabilities))
	}
	for _, c := range s.GatewayCapabilities {
		if !validID(c, maxCapability) {
			errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES: %q is not 1-64 printable ASCII characters without spaces", c))
		}
	}
	if s.GatewayHeartbeat < 0 {
		errs = append(errs, fmt.Errorf("CONCLAVE_AGENT_HOST_GATEWAY_HEARTBEAT: must not be negative, not %s", s.GatewayHeartbeat))
	}
	return errs
}

// gatewayAgentID is the agent_id the agent registers under.
func (s Settings) gatewayAgentID() string {
	if s.GatewayAgentID != "" {
		return s.GatewayAgentID
	}
	return s.InstanceID
}
