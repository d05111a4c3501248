// Package agentconfig loads the bridge's config.yaml (as the ADK bridge has
// it): the workspace, the security settings and the tool agents, each
// resolved into a hybrid.Agent ready to run.
package agentconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"go.yaml.in/yaml/v3"

	"github.com/conclave-ai/conclave/pkg/hybrid"
)

// HealthCheckTool is the name of the bridge's own tool; no agent may take it.
const HealthCheckTool = "health_check"

// DefaultPassEnv is environment.pass's default: the variables agents inherit
// from the bridge when the config names none.
var DefaultPassEnv = []string{"PATH", "HOME", "LANG"}

// maxConfigBytes bounds config.yaml; a real one is a few kilobytes.
const maxConfigBytes = 1 << 20

// toolName is MCP's tool-name rule, shortened to what clients display well.
var toolName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,64}$`)

var flagName = regexp.MustCompile(`^--?[a-zA-Z0-9][a-zA-Z0-9_-]*$`)

// envName is a portable environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// file is config.yaml as written.
type file struct {
	Workspace string `yaml:"workspace"`
	Security  struct {
		ValidateInputs *bool `yaml:"validate_inputs"`
		MaxParamLength *int  `yaml:"max_param_length"`
	} `yaml:"security"`
	Environment struct {
		Pass []string `yaml:"pass"`
	} `yaml:"environment"`
	Agents map[string]agentFile `yaml:"agents"`
}

type agentFile struct {
	Path           string            `yaml:"path"`
	Python         string            `yaml:"python"`
	Executable     bool              `yaml:"executable"`
	Timeout        *seconds          `yaml:"timeout"`
	Description    string            `yaml:"description"`
	Parameters     map[string]any    `yaml:"parameters"`
	Args           map[string]string `yaml:"args"`
	Env            []string          `yaml:"env"`
	MaxOutputBytes *int64            `yaml:"max_output_bytes"`
	// Governed, Risk and ApprovalTimeout: each call first asks the
	// Librarian (docs/governance.md).
	Governed        bool     `yaml:"governed"`
	Risk            string   `yaml:"risk"`
	ApprovalTimeout *seconds `yaml:"approval_timeout"`
}

// seconds is a timeout written as seconds (600, 2.5) or a Go duration
// ("10m").
type seconds time.Duration

func (s *seconds) UnmarshalYAML(n *yaml.Node) error {
	if f, err := strconv.ParseFloat(n.Value, 64); err == nil && n.Kind == yaml.ScalarNode {
		*s = seconds(time.Duration(f * float64(time.Second)))
		return nil
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: timeout %q is neither seconds (600) nor a duration (10m)", n.Line, n.Value)
	}
	*s = seconds(d)
	return nil
}

// Config is a loaded config.yaml.
type Config struct {
	// File is the config file's absolute path.
	File string
	// Workspace is the agents' working directory and PYTHONPATH.
	Workspace      string
	ValidateInputs bool
	MaxParamLength int
	// Agents, sorted by name.
	Agents []*Agent
}

// Agent is one configured tool agent.
type Agent struct {
	Name        string
	Description string
	// InputSchema is the JSON Schema of the tool's parameters, an object
	// schema.
	InputSchema json.RawMessage
	schema      *jsonschema.Resolved
	// Script and Python are as written in config.yaml, for messages.
	Script, Python string
	// EnvNames are the variables the agent asks for beyond environment.pass.
	EnvNames []string
	// Governed: each call first asks the Librarian for approval, and the
	// agent runs only if it is approved. Risk is the request's
	// risk_assessment (high or critical escalates to a person);
	// ApprovalTimeout bounds the wait for that person (0: the
	// Librarian's timeouts.escalation).
	Governed        bool
	Risk            string
	ApprovalTimeout time.Duration
	// Run is the resolved agent; each call copies it.
	Run hybrid.Agent
}

// Agent returns the agent called name.
func (c *Config) Agent(name string) (*Agent, bool) {
	i := sort.Search(len(c.Agents), func(i int) bool { return c.Agents[i].Name >= name })
	if i < len(c.Agents) && c.Agents[i].Name == name {
		return c.Agents[i], true
	}
	return nil, false
}

// ValidateSchema checks params (decoded with encoding/json's defaults)
// against the agent's parameter schema; the error names what is wrong.
func (a *Agent) ValidateSchema(params any) error {
	if err := a.schema.Validate(params); err != nil {
		return &hybrid.Error{Kind: hybrid.KindValidation, Rule: hybrid.RuleParams, ExitCode: -1,
			Message: fmt.Sprintf("parameters do not match %s's schema: %v", a.Name, err)}
	}
	return nil
}

// Load reads config.yaml at path. workspace, when not empty, overrides the
// file's workspace (CONCLAVE_BRIDGE_WORKSPACE); getenv supplies the values
// of the variables agents may inherit. Paths are resolved but not checked:
// a missing script is reported by Health, diagnose and each call, not by
// refusing to start. Every error names the file, the key and the problem.
func Load(path, workspace string, getenv func(string) (string, bool)) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	fail := func(key, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %s", abs, key, fmt.Sprintf(format, args...))
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("bridge config: %w (set CONCLAVE_BRIDGE_CONFIG to the config.yaml path)", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", abs, err)
	}
	if len(raw) > maxConfigBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes; is this the config file?", abs, maxConfigBytes)
	}
	var doc file
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", abs, yamlError(err))
	}

	cfg := &Config{File: abs, ValidateInputs: true, MaxParamLength: hybrid.DefaultMaxParamLength}
	if doc.Security.ValidateInputs != nil {
		cfg.ValidateInputs = *doc.Security.ValidateInputs
	}
	if n := doc.Security.MaxParamLength; n != nil {
		if *n < 1 {
			return nil, fail("security.max_param_length", "must be a positive number of characters, got %d", *n)
		}
		cfg.MaxParamLength = *n
	}
	switch {
	case workspace != "":
		cfg.Workspace, err = filepath.Abs(workspace)
	case doc.Workspace == "":
		cfg.Workspace = filepath.Dir(abs)
	case filepath.IsAbs(doc.Workspace):
		cfg.Workspace = filepath.Clean(doc.Workspace)
	default:
		cfg.Workspace = filepath.Join(filepath.Dir(abs), doc.Workspace)
	}
	if err != nil {
		return nil, fail("workspace", "%v", err)
	}
	pass := doc.Environment.Pass
	if pass == nil {
		pass = DefaultPassEnv
	}
	for i, name := range pass {
		if !envName.MatchString(name) {
			return nil, fail(fmt.Sprintf("environment.pass[%d]", i), "%q is not an environment variable name", name)
		}
	}
	if len(doc.Agents) == 0 {
		return nil, fail("agents", "no agents configured; add at least one under agents:")
	}
	for name, af := range doc.Agents {
		a, err := resolveAgent(cfg, name, af, pass, getenv)
		if err != nil {
			return nil, fmt.Errorf("%s: agents.%s.%w", abs, name, err)
		}
		cfg.Agents = append(cfg.Agents, a)
	}
	sort.Slice(cfg.Agents, func(i, j int) bool { return cfg.Agents[i].Name < cfg.Agents[j].Name })
	return cfg, nil
}

// yamlError makes yaml's messages about unknown keys say which key.
func yamlError(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s", strings.Join(te.Errors, "; "))
	}
	return err
}

// keyError is an error about one key of an agent; Load prefixes the agent.
type keyError struct{ key, msg string }

func (e *keyError) Error() string { return e.key + ": " + e.msg }

func resolveAgent(cfg *Config, name string, af agentFile, pass []string, getenv func(string) (string, bool)) (*Agent, error) {
	bad := func(key, format string, args ...any) error {
		return &keyError{key, fmt.Sprintf(format, args...)}
	}
	if !toolName.MatchString(name) {
		return nil, bad("name", "%q is not a tool name: use 1 to 64 letters, digits, '_', '-' or '.'", name)
	}
	if name == HealthCheckTool {
		return nil, bad("name", "%q is the bridge's own tool; rename the agent", name)
	}
	if af.Path == "" {
		return nil, bad("path", "required: the agent's script, relative to the workspace")
	}
	a := &Agent{Name: name, Description: af.Description, Script: af.Path, Python: af.Python, EnvNames: af.Env, Governed: af.Governed, Risk: af.Risk}
	if (af.Risk != "" || af.ApprovalTimeout != nil) && !af.Governed {
		return nil, bad("governed", "risk and approval_timeout are for governed tools; add governed: true")
	}
	if len(af.Risk) > 1000 {
		return nil, bad("risk", "at most 1000 characters")
	}
	if af.ApprovalTimeout != nil {
		if a.ApprovalTimeout = time.Duration(*af.ApprovalTimeout); a.ApprovalTimeout <= 0 {
			return nil, bad("approval_timeout", "must be positive, got %s", a.ApprovalTimeout)
		}
	}
	if a.Description == "" {
		a.Description = "Runs the " + name + " agent."
	}
	schema := af.Parameters
	if schema == nil {
		schema = map[string]any{"type": "object"}
	}
	if schema["type"] != "object" {
		return nil, bad("parameters", `must be a JSON Schema with type: object (the tool's arguments are one object), got type %v`, schema["type"])
	}
	raw, err := json.Marshal(schema)
	if err != nil {
		return nil, bad("parameters", "cannot be expressed as JSON: %v", err)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, bad("parameters", "is not a JSON Schema: %v", err)
	}
	if a.schema, err = s.Resolve(nil); err != nil {
		return nil, bad("parameters", "is not a valid JSON Schema: %v", err)
	}
	a.InputSchema = raw

	timeout := hybrid.DefaultTimeout
	if af.Timeout != nil {
		timeout = time.Duration(*af.Timeout)
		if timeout <= 0 {
			return nil, bad("timeout", "must be positive, got %s", timeout)
		}
	}
	maxOut := int64(hybrid.DefaultMaxStdout)
	if af.MaxOutputBytes != nil {
		if *af.MaxOutputBytes < 1 {
			return nil, bad("max_output_bytes", "must be positive, got %d", *af.MaxOutputBytes)
		}
		maxOut = *af.MaxOutputBytes
	}
	for param, flag := range af.Args {
		if !flagName.MatchString(flag) {
			return nil, bad("args."+param, "%q is not a command-line flag such as --issue", flag)
		}
	}
	env := []string{"PYTHONPATH=" + cfg.Workspace}
	names := append(append([]string(nil), pass...), af.Env...)
	for i, n := range af.Env {
		if !envName.MatchString(n) {
			return nil, bad(fmt.Sprintf("env[%d]", i), "%q is not an environment variable name", n)
		}
	}
	for _, n := range names {
		if n == "PYTHONPATH" {
			continue
		}
		if v, ok := getenv(n); ok {
			env = append(env, n+"="+v)
		}
	}
	python := af.Python
	if af.Executable && python != "" {
		return nil, bad("executable", "an executable script runs by itself; remove python: %s or executable: true", python)
	}
	if python == "" && !af.Executable {
		python = "python3"
	}
	a.Python = python
	interp := python
	switch {
	case python == "": // executable: the script's #! line picks the interpreter
	case filepath.IsAbs(python):
	case strings.ContainsRune(python, '/'):
		interp = filepath.Join(cfg.Workspace, python)
	default:
		if p, err := exec.LookPath(python); err == nil {
			interp = p
		}
	}
	script := af.Path
	if !filepath.IsAbs(script) {
		script = filepath.Join(cfg.Workspace, script)
	}
	a.Run = hybrid.Agent{
		Name: name, Interpreter: interp, Script: script, Dir: cfg.Workspace, Env: env,
		Flags: hybrid.SortedFlags(af.Args), Timeout: timeout, MaxStdout: maxOut,
		ValidateInputs: cfg.ValidateInputs, MaxParamLength: cfg.MaxParamLength,
	}
	return a, nil
}
