// Package agenttype is the registry of agent types (as in Kandev's protocol): built-in
// defaults overlaid by a YAML file, each entry saying how to run an agent and
// which protocol it speaks.
package agenttype

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/hybrid"
	"go.yaml.in/yaml/v3"
)

// Protocols an agent type may speak on stdio.
const (
	// ProtocolDetect sends one initialize both dialects accept and picks the
	// dialect from the response's protocolVersion.
	ProtocolDetect = ""
	// ProtocolACP is the Agent Client Protocol of agentclientprotocol.com.
	ProtocolACP = "acp"
	// ProtocolKandev is Kandev's dialect of ACP.
	ProtocolKandev = "kandev"
	// ProtocolLegacy is Kandev's pre-JSON-RPC line format: the agent is
	// given no requests and reports with {"type": ...} lines.
	ProtocolLegacy = "legacy"
	// ProtocolOneshot is the ADK bridge's hybrid protocol (pkg/hybrid), as the
	// bridge runs it: a process per prompt, the prompt's parameters as
	// command-line flags (Args) and JSON on stdin, one JSON object on
	// stdout.
	ProtocolOneshot = "oneshot"
)

// Permission policies answer an ACP agent's session/request_permission.
const (
	PermissionAllow       = "allow"
	PermissionDeny        = "deny"
	PermissionAllowAlways = "allow_always"
	// PermissionLibrarian asks the Librarian (docs/governance.md): each
	// request becomes an APPROVAL; what it escalates, a person decides.
	PermissionLibrarian = "librarian"
)

// Type is one registry entry. The YAML keys are Kandev's field names.
type Type struct {
	ID          string        `yaml:"id"`
	Name        string        `yaml:"name"`
	Description string        `yaml:"description"`
	Image       string        `yaml:"image"`
	Command     []string      `yaml:"command"`
	WorkingDir  string        `yaml:"working_dir"`
	MemoryMB    int           `yaml:"memory_mb"`
	CPUCores    float64       `yaml:"cpu_cores"`
	Timeout     time.Duration `yaml:"timeout"`
	// SilenceTimeout bounds how long an agent may send nothing at all on
	// stdout in the middle of a turn (no update, request or response)
	// before its protocol is taken as dead; 0 means the runner's default
	// (CONCLAVE_RUNNER_SILENCE_TIMEOUT).
	SilenceTimeout time.Duration `yaml:"silence_timeout"`
	Capabilities   []string      `yaml:"capabilities"`
	RequiredEnv    []string      `yaml:"required_env"`
	// LaunchEnv is what else a launch may set in its env: names, and
	// prefixes ending in '*' (BUB_*). A launch may set nothing else but
	// RequiredEnv and RunnerLaunchEnv, and never a hook variable
	// (HookVariable), which only Env can set.
	LaunchEnv []string `yaml:"launch_env"`
	Protocol  string   `yaml:"protocol"`
	// Enabled: launches of the type are taken. An entry of the YAML file
	// without enabled is enabled.
	Enabled bool `yaml:"enabled"`
	// Env is set for every instance of the type, under the launch's env.
	Env map[string]string `yaml:"env"`
	// Gateway registers each instance at the coven gateway as a coven
	// agent (docs/runner-agents.md, "On the gateway"); a launch may also ask for
	// it in its metadata.
	Gateway bool `yaml:"gateway"`
	// Permission answers session/request_permission (ACP): allow, deny,
	// allow_always or librarian; default deny.
	Permission string `yaml:"permission"`
	// ApprovalTimeout bounds, for permission librarian, how long a request
	// the Librarian escalated waits for a person, when shorter than the
	// Librarian's own timeouts.escalation; 0: the Librarian's.
	ApprovalTimeout time.Duration `yaml:"approval_timeout"`
	// AuthMethod is the id of one of the authMethods an ACP agent offers
	// in initialize: the runner calls authenticate with it before it opens
	// the session. Empty: the runner does not authenticate (the agent
	// finds its credentials itself, in the type's env).
	AuthMethod string `yaml:"auth_method"`
	// Args maps a oneshot agent's parameters to command-line flags
	// (issue_number: --issue), as the bridge's config.yaml does.
	Args map[string]string `yaml:"args"`
	// MaxStdoutBytes bounds a oneshot agent's output (default 10 MiB).
	MaxStdoutBytes int64 `yaml:"max_stdout_bytes"`
	// ValidateInputs applies the hybrid protocol's input rules to a oneshot agent's
	// parameters before it runs, as the bridge's security.validate_inputs
	// does (default true); MaxParamLength is security.max_param_length
	// (default 10,000).
	ValidateInputs *bool `yaml:"validate_inputs"`
	MaxParamLength int   `yaml:"max_param_length"`
}

// OneshotValidation is whether a oneshot agent's parameters are validated
// before it runs, and the longest string parameter allowed.
func (t Type) OneshotValidation() (validate bool, maxParamLength int) {
	validate = t.ValidateInputs == nil || *t.ValidateInputs
	maxParamLength = t.MaxParamLength
	if maxParamLength == 0 {
		maxParamLength = hybrid.DefaultMaxParamLength
	}
	return validate, maxParamLength
}

var (
	idPattern         = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	authMethodPattern = regexp.MustCompile(`^[!-~]{1,128}$`)
)

// RunnableOn reports why executor ("local" or "kubernetes") cannot start
// an agent of type t, or nil when it can. A oneshot agent runs its command
// in the runner's own process tree on either; an ACP agent runs its
// command as a local process, or under agent-host in a Job of its image.
// The API asks before it accepts a launch, so that a launch that cannot
// start is refused with the reason rather than failing after it.
func (t Type) RunnableOn(executor string) error {
	switch {
	case len(t.Command) == 0 && (executor == "local" || t.Protocol == ProtocolOneshot):
		return fmt.Errorf("agent type %s has no command, which the %s executor runs", t.ID, executor)
	case executor == "kubernetes" && t.Protocol != ProtocolOneshot && t.Image == "":
		return fmt.Errorf("agent type %s has no image, which the kubernetes executor runs in a Job", t.ID)
	case executor == "kubernetes" && len(t.Command) == 0:
		return fmt.Errorf("agent type %s has no command, which agent-host runs in its Job", t.ID)
	}
	return nil
}

// Validate reports the first thing wrong with t.
func (t Type) Validate() error {
	switch {
	case !idPattern.MatchString(t.ID):
		return fmt.Errorf("id %q: must be 1-63 lowercase letters, digits, '.', '_' or '-'", t.ID)
	case t.Enabled && len(t.Command) == 0 && t.Image == "":
		return fmt.Errorf("agent type %s: needs a command (local executor) or an image", t.ID)
	case t.Timeout < 0:
		return fmt.Errorf("agent type %s: negative timeout %s", t.ID, t.Timeout)
	case t.SilenceTimeout < 0:
		return fmt.Errorf("agent type %s: negative silence_timeout %s", t.ID, t.SilenceTimeout)
	case t.MemoryMB < 0 || t.CPUCores < 0:
		return fmt.Errorf("agent type %s: negative memory_mb or cpu_cores", t.ID)
	}
	switch t.Protocol {
	case ProtocolDetect, ProtocolACP, ProtocolKandev, ProtocolLegacy:
		if len(t.Args) > 0 || t.MaxStdoutBytes != 0 || t.ValidateInputs != nil || t.MaxParamLength != 0 {
			return fmt.Errorf("agent type %s: args, max_stdout_bytes, validate_inputs and max_param_length are for protocol oneshot only", t.ID)
		}
	case ProtocolOneshot:
		if t.Enabled && (len(t.Command) < 1 || len(t.Command) > 2) {
			return fmt.Errorf("agent type %s: a oneshot agent's command is [script] or [interpreter, script] (it runs on the local executor only)", t.ID)
		}
		if t.MaxStdoutBytes < 0 {
			return fmt.Errorf("agent type %s: negative max_stdout_bytes", t.ID)
		}
		if t.MaxParamLength < 0 {
			return fmt.Errorf("agent type %s: negative max_param_length", t.ID)
		}
		for param, flag := range t.Args {
			if param == "" || !strings.HasPrefix(flag, "-") {
				return fmt.Errorf("agent type %s: args %q: %q must be a flag starting with '-'", t.ID, param, flag)
			}
		}
	default:
		return fmt.Errorf("agent type %s: protocol %q is not one of acp, kandev, legacy, oneshot (or empty to detect)", t.ID, t.Protocol)
	}
	switch t.Permission {
	case "", PermissionAllow, PermissionDeny, PermissionAllowAlways, PermissionLibrarian:
	default:
		return fmt.Errorf("agent type %s: permission %q is not one of allow, deny, allow_always, librarian", t.ID, t.Permission)
	}
	switch {
	case t.ApprovalTimeout < 0:
		return fmt.Errorf("agent type %s: negative approval_timeout %s", t.ID, t.ApprovalTimeout)
	case t.ApprovalTimeout > 0 && t.Permission != PermissionLibrarian:
		return fmt.Errorf("agent type %s: approval_timeout is for permission librarian only", t.ID)
	}
	if t.AuthMethod != "" && !authMethodPattern.MatchString(t.AuthMethod) {
		return fmt.Errorf("agent type %s: auth_method %q: must be 1-128 printable ASCII characters without spaces", t.ID, t.AuthMethod)
	}
	if t.AuthMethod != "" && (t.Protocol == ProtocolKandev || t.Protocol == ProtocolLegacy || t.Protocol == ProtocolOneshot) {
		return fmt.Errorf("agent type %s: auth_method is for ACP agents (protocol acp, or detected), not %s", t.ID, t.Protocol)
	}
	return t.validateEnvNames()
}

// DefaultTimeout bounds an instance whose type sets no timeout.
const DefaultTimeout = time.Hour

// EffectiveTimeout is t.Timeout, or DefaultTimeout when unset.
func (t Type) EffectiveTimeout() time.Duration {
	if t.Timeout <= 0 {
		return DefaultTimeout
	}
	return t.Timeout
}

// Defaults are Kandev's augment-agent and the repository's example agent.
// augment-agent runs as an image (Kubernetes executor); on the local
// executor it needs a command from the YAML file.
func Defaults() []Type {
	return []Type{
		{
			ID: "augment-agent", Name: "Augment Agent",
			Description: "Primary AI coding agent powered by Auggie CLI.",
			Image:       "kandev/augment-agent:latest", WorkingDir: "/workspace",
			MemoryMB: 4096, CPUCores: 2, Timeout: time.Hour,
			Capabilities: []string{"code_generation", "code_review", "refactoring", "testing", "shell_execution"},
			RequiredEnv:  []string{"AUGMENT_SESSION_AUTH", "TASK_DESCRIPTION"},
			Protocol:     ProtocolKandev, Enabled: true,
		},
	}
}

// Registry holds the agent types by id.
type Registry struct {
	types map[string]Type
}

// New builds a registry from entries; a later entry with the same id
// replaces an earlier one.
func New(entries ...Type) (*Registry, error) {
	r := &Registry{types: make(map[string]Type, len(entries))}
	for _, t := range entries {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		r.types[t.ID] = t
	}
	return r, nil
}

// fileFormat is the YAML file: {agent_types: [...]}.
type fileFormat struct {
	AgentTypes []Type `yaml:"agent_types"`
}

// Parse reads the YAML form of a registry file; unknown keys are errors, so
// a misspelt field is not silently ignored.
func Parse(data []byte) ([]Type, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f fileFormat
	// An empty file (io.EOF) is an empty registry.
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("agent types: %w", err)
	}
	// Which entries say enabled at all: the others are enabled. (A second
	// decode of what the first accepted, rather than a custom unmarshaler,
	// whose nested decode would not refuse unknown keys.)
	var said struct {
		AgentTypes []struct {
			Enabled *bool `yaml:"enabled"`
		} `yaml:"agent_types"`
	}
	if err := yaml.Unmarshal(data, &said); err != nil || len(said.AgentTypes) != len(f.AgentTypes) {
		return nil, fmt.Errorf("agent types: reading enabled: %v", err)
	}
	for i := range f.AgentTypes {
		if said.AgentTypes[i].Enabled == nil {
			f.AgentTypes[i].Enabled = true
		}
	}
	seen := map[string]bool{}
	for _, t := range f.AgentTypes {
		if seen[t.ID] {
			return nil, fmt.Errorf("agent types: id %q appears twice", t.ID)
		}
		seen[t.ID] = true
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("agent types: %w", err)
		}
	}
	return f.AgentTypes, nil
}

// Load is the defaults overlaid by the YAML file at path ("" for none).
func Load(path string) (*Registry, error) {
	entries := Defaults()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("agent types: %w", err)
		}
		extra, err := Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		entries = append(entries, extra...)
	}
	return New(entries...)
}

// Summary lists the types by id, saying which are disabled and which
// protocol and command or image each runs, for the runner's startup log.
func (r *Registry) Summary() string {
	var b strings.Builder
	for i, t := range r.List() {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(t.ID)
		b.WriteString(" (")
		b.WriteString(cmp.Or(t.Protocol, "detect"))
		switch {
		case len(t.Command) > 0:
			b.WriteString(", " + t.Command[0])
		case t.Image != "":
			b.WriteString(", image " + t.Image)
		}
		if !t.Enabled {
			b.WriteString(", disabled")
		}
		b.WriteString(")")
	}
	return b.String()
}

// Get returns the type id, if registered.
func (r *Registry) Get(id string) (Type, bool) {
	t, ok := r.types[id]
	return t, ok
}

// List returns every type, by id.
func (r *Registry) List() []Type {
	out := make([]Type, 0, len(r.types))
	for _, t := range r.types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// MissingEnv returns the first required variable env does not set to a
// non-empty value, or "".
func (t Type) MissingEnv(env map[string]string) string {
	for _, k := range t.RequiredEnv {
		if env[k] == "" && t.Env[k] == "" {
			return k
		}
	}
	return ""
}
