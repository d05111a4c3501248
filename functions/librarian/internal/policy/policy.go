// Package policy loads and validates the Librarian's two configuration files,
// agents.yaml (the agent registry) and protocol.yaml (timeouts, limits and
// compliance switches), as the Librarian protocol writes them. Both are read
// once, at cold start; every error names the file and the key to fix.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// File names inside a configuration directory.
const (
	AgentsFile   = "agents.yaml"
	ProtocolFile = "protocol.yaml"
)

// TargetTypes are the protocol's target types, in its order.
var TargetTypes = []string{"architecture", "design", "code", "test", "docs"}

// Capabilities an agent may be given. The protocol's examples use all of them.
var Capabilities = []string{"read", "write", "analyze", "suggest", "validate"}

// Rate is a request budget over a fixed window, e.g. 100/hour.
type Rate struct {
	Count  int
	Window time.Duration
}

func (r Rate) String() string {
	for name, d := range windows {
		if d == r.Window {
			return fmt.Sprintf("%d/%s", r.Count, name)
		}
	}
	return fmt.Sprintf("%d/%s", r.Count, r.Window)
}

var windows = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
}

// ParseRate reads "N/second|minute|hour|day".
func ParseRate(s string) (Rate, error) {
	n, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	count, err := strconv.Atoi(strings.TrimSpace(n))
	window, known := windows[strings.TrimSpace(unit)]
	if !ok || err != nil || !known || count < 1 {
		return Rate{}, fmt.Errorf("%q is not N/second, N/minute, N/hour or N/day with N > 0", s)
	}
	return Rate{Count: count, Window: window}, nil
}

var sizePattern = regexp.MustCompile(`^([0-9]+)\s*(B|KB|MB)?$`)

// ParseSize reads a byte size: 512, 512B, 50KB, 1MB (binary multiples).
func ParseSize(s string) (int64, error) {
	m := sizePattern.FindStringSubmatch(strings.ToUpper(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size such as 512B, 50KB or 1MB", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n <= 0 || n > 1<<40 {
		return 0, fmt.Errorf("%q is not a positive size", s)
	}
	switch m[2] {
	case "KB":
		n <<= 10
	case "MB":
		n <<= 20
	}
	return n, nil
}

// ParseMillis reads the protocol's durations, e.g. "5000ms"; Go durations
// ("5s") are accepted too.
func ParseMillis(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration such as 5000ms", s)
	}
	return d, nil
}

// Agent is one registry entry.
type Agent struct {
	ID           string
	Type         string
	Capabilities []string
	// RateLimit is the agent's own budget, beside the API's.
	RateLimit Rate
	// MaxRequestSize bounds the agent's request bodies.
	MaxRequestSize int64
	// AllowedTargets are target types; "all" is expanded.
	AllowedTargets []string
}

// Can reports whether the agent has capability c.
func (a Agent) Can(c string) bool { return slices.Contains(a.Capabilities, c) }

// MayTarget reports whether the agent may act on target type t.
func (a Agent) MayTarget(t string) bool { return slices.Contains(a.AllowedTargets, t) }

// Protocol is protocol.yaml.
type Protocol struct {
	Version    string
	Timeouts   Timeouts
	Limits     Limits
	Compliance Compliance
}

// Timeouts bound the work on one request.
type Timeouts struct {
	// Validation bounds the validation pipeline.
	Validation time.Duration
	// Response bounds a whole request.
	Response time.Duration
	// Escalation is how long a human review may take; it sets
	// estimated_review_time.
	Escalation time.Duration
}

// Limits bound what a request may carry.
type Limits struct {
	MaxContentSize   int64
	MaxReferences    int
	MaxDeviations    int
	MaxRetryAttempts int
}

// Compliance are the switches that change the pipeline's decisions.
type Compliance struct {
	// StrictMode makes content-format problems reject rather than warn, and
	// unallowed deviations reject rather than escalate.
	StrictMode bool
	// AllowDeviations accepts declared deviations as constraints instead of
	// refusing them.
	AllowDeviations bool
	// RequireRationale makes rationale required for APPROVAL.
	RequireRationale bool
	// EnforceReferences rejects unknown references instead of warning.
	EnforceReferences bool
	// RequireKnownTargets (default true, as the protocol's pipeline does)
	// makes a modify, delete or code/test create whose target the graph
	// does not hold, or that names none, rejected or sent back for
	// clarification. Off, such a change is judged by the later rules
	// (deviations, risk) alone: for agents that edit files the graph does
	// not track. It is not one of the protocol's keys, so it may be left out.
	RequireKnownTargets bool
}

// Policy is both files, validated.
type Policy struct {
	Agents   map[string]Agent
	Protocol Protocol
}

// Agent returns the registry entry of id.
func (p *Policy) Agent(id string) (Agent, bool) {
	a, ok := p.Agents[id]
	return a, ok
}

// AgentIDs lists the registered agents in order.
func (p *Policy) AgentIDs() []string {
	ids := make([]string, 0, len(p.Agents))
	for id := range p.Agents {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// AddAgent registers id, when the registry lacks it, as an agent that may
// ask about changes to every target type (read, write, analyze; the
// protocol's max_content_size; 1000/hour): conclave dev's entry for the
// runner's agent types under the librarian permission policy, so that the
// flow works without an agents.yaml of one's own. It reports whether it
// added one.
func (p *Policy) AddAgent(id string) bool {
	if _, ok := p.Agents[id]; ok || id == "" {
		return false
	}
	p.Agents[id] = Agent{ID: id, Type: "runner-agent", Capabilities: []string{"read", "write", "analyze"},
		RateLimit: Rate{Count: 1000, Window: time.Hour}, MaxRequestSize: p.Protocol.Limits.MaxContentSize,
		AllowedTargets: slices.Clone(TargetTypes)}
	return true
}

// Load reads agents.yaml and protocol.yaml from fsys; dir names the
// directory in errors.
func Load(fsys fs.FS, dir string) (*Policy, error) {
	protoData, err := fs.ReadFile(fsys, ProtocolFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", join(dir, ProtocolFile), err)
	}
	agentsData, err := fs.ReadFile(fsys, AgentsFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", join(dir, AgentsFile), err)
	}
	return Parse(agentsData, protoData, dir)
}

// Parse validates the two files' contents; dir names their directory in
// errors.
func Parse(agentsYAML, protocolYAML []byte, dir string) (*Policy, error) {
	proto, err := parseProtocol(protocolYAML)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", join(dir, ProtocolFile), err)
	}
	agents, err := parseAgents(agentsYAML, proto.Limits.MaxContentSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", join(dir, AgentsFile), err)
	}
	return &Policy{Agents: agents, Protocol: proto}, nil
}

func join(dir, file string) string {
	if dir == "" {
		return file
	}
	return strings.TrimSuffix(dir, "/") + "/" + file
}

// decodeStrict decodes one YAML document, refusing unknown keys so that a
// misspelt setting is an error rather than silently ignored.
func decodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the file is empty")
		}
		return err
	}
	return nil
}

type rawProtocol struct {
	Protocol *struct {
		Version  string `yaml:"version"`
		Timeouts struct {
			Validation string `yaml:"validation"`
			Response   string `yaml:"response"`
			Escalation string `yaml:"escalation"`
		} `yaml:"timeouts"`
		Limits struct {
			MaxContentSize   string `yaml:"max_content_size"`
			MaxReferences    *int   `yaml:"max_references"`
			MaxDeviations    *int   `yaml:"max_deviations"`
			MaxRetryAttempts *int   `yaml:"max_retry_attempts"`
		} `yaml:"limits"`
		Compliance struct {
			StrictMode        *bool `yaml:"strict_mode"`
			AllowDeviations   *bool `yaml:"allow_deviations"`
			RequireRationale  *bool `yaml:"require_rationale"`
			EnforceReferences *bool `yaml:"enforce_references"`
			// Not the protocol's: optional, default true.
			RequireKnownTargets *bool `yaml:"require_known_targets"`
		} `yaml:"compliance"`
	} `yaml:"protocol"`
}

func parseProtocol(data []byte) (Protocol, error) {
	var raw rawProtocol
	if err := decodeStrict(data, &raw); err != nil {
		return Protocol{}, err
	}
	r := raw.Protocol
	if r == nil {
		return Protocol{}, errors.New("protocol: missing")
	}
	p := Protocol{Version: r.Version}
	if p.Version != "1.0" {
		return p, fmt.Errorf("protocol.version: %q is not a supported version (1.0)", r.Version)
	}
	for _, d := range []struct {
		key string
		raw string
		out *time.Duration
	}{
		{"protocol.timeouts.validation", r.Timeouts.Validation, &p.Timeouts.Validation},
		{"protocol.timeouts.response", r.Timeouts.Response, &p.Timeouts.Response},
		{"protocol.timeouts.escalation", r.Timeouts.Escalation, &p.Timeouts.Escalation},
	} {
		v, err := ParseMillis(d.raw)
		if err != nil {
			return p, fmt.Errorf("%s: %w", d.key, err)
		}
		*d.out = v
	}
	if p.Timeouts.Validation > p.Timeouts.Response {
		return p, fmt.Errorf("protocol.timeouts.validation: %s is longer than protocol.timeouts.response (%s)", p.Timeouts.Validation, p.Timeouts.Response)
	}
	size, err := ParseSize(r.Limits.MaxContentSize)
	if err != nil {
		return p, fmt.Errorf("protocol.limits.max_content_size: %w", err)
	}
	if size > maxContentCeiling {
		return p, fmt.Errorf("protocol.limits.max_content_size: %d bytes is over %d, the most one stored request may hold", size, maxContentCeiling)
	}
	p.Limits.MaxContentSize = size
	for _, n := range []struct {
		key    string
		raw    *int
		out    *int
		lo, hi int
	}{
		{"protocol.limits.max_references", r.Limits.MaxReferences, &p.Limits.MaxReferences, 0, 1000},
		{"protocol.limits.max_deviations", r.Limits.MaxDeviations, &p.Limits.MaxDeviations, 0, 1000},
		{"protocol.limits.max_retry_attempts", r.Limits.MaxRetryAttempts, &p.Limits.MaxRetryAttempts, 0, 100},
	} {
		if n.raw == nil {
			return p, fmt.Errorf("%s: missing", n.key)
		}
		if *n.raw < n.lo || *n.raw > n.hi {
			return p, fmt.Errorf("%s: %d is outside %d..%d", n.key, *n.raw, n.lo, n.hi)
		}
		*n.out = *n.raw
	}
	for _, b := range []struct {
		key string
		raw *bool
		out *bool
	}{
		{"protocol.compliance.strict_mode", r.Compliance.StrictMode, &p.Compliance.StrictMode},
		{"protocol.compliance.allow_deviations", r.Compliance.AllowDeviations, &p.Compliance.AllowDeviations},
		{"protocol.compliance.require_rationale", r.Compliance.RequireRationale, &p.Compliance.RequireRationale},
		{"protocol.compliance.enforce_references", r.Compliance.EnforceReferences, &p.Compliance.EnforceReferences},
	} {
		if b.raw == nil {
			return p, fmt.Errorf("%s: missing (true or false)", b.key)
		}
		*b.out = *b.raw
	}
	p.Compliance.RequireKnownTargets = r.Compliance.RequireKnownTargets == nil || *r.Compliance.RequireKnownTargets
	return p, nil
}

// maxContentCeiling keeps a request, stored with its content, under the
// store's 400 KB item limit.
const maxContentCeiling = 300 << 10

type rawAgent struct {
	Type           string   `yaml:"type"`
	Capabilities   []string `yaml:"capabilities"`
	RateLimit      string   `yaml:"rate_limit"`
	MaxRequestSize string   `yaml:"max_request_size"`
	AllowedTargets []string `yaml:"allowed_targets"`
}

// agentIDPattern leaves the length (at most 64) to validAgentID: a counted
// repetition ({0,63}) compiles to that many copies of its class, a
// measurable part of the Lambda's cold start (bench/librarian).
var agentIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func validAgentID(id string) bool { return len(id) <= 64 && agentIDPattern.MatchString(id) }

func parseAgents(data []byte, maxContent int64) (map[string]Agent, error) {
	var raw struct {
		Agents map[string]*rawAgent `yaml:"agents"`
	}
	if err := decodeStrict(data, &raw); err != nil {
		return nil, err
	}
	if len(raw.Agents) == 0 {
		return nil, errors.New("agents: no agent is registered")
	}
	agents := make(map[string]Agent, len(raw.Agents))
	for id, r := range raw.Agents {
		key := "agents." + id
		if !validAgentID(id) {
			return nil, fmt.Errorf("%s: the agent id must be 1 to 64 letters, digits, '.', '_' or '-'", key)
		}
		if r == nil {
			return nil, fmt.Errorf("%s: empty entry", key)
		}
		a := Agent{ID: id, Type: strings.TrimSpace(r.Type)}
		if a.Type == "" {
			return nil, fmt.Errorf("%s.type: missing", key)
		}
		if len(r.Capabilities) == 0 {
			return nil, fmt.Errorf("%s.capabilities: missing", key)
		}
		for _, c := range r.Capabilities {
			if !slices.Contains(Capabilities, c) {
				return nil, fmt.Errorf("%s.capabilities: %q is not one of %s", key, c, strings.Join(Capabilities, ", "))
			}
		}
		a.Capabilities = slices.Clone(r.Capabilities)
		rate, err := ParseRate(r.RateLimit)
		if err != nil {
			return nil, fmt.Errorf("%s.rate_limit: %w", key, err)
		}
		a.RateLimit = rate
		a.MaxRequestSize = maxContent
		if r.MaxRequestSize != "" {
			if a.MaxRequestSize, err = ParseSize(r.MaxRequestSize); err != nil {
				return nil, fmt.Errorf("%s.max_request_size: %w", key, err)
			}
		}
		if len(r.AllowedTargets) == 0 {
			return nil, fmt.Errorf("%s.allowed_targets: missing (a list of %s, or [all])", key, strings.Join(TargetTypes, ", "))
		}
		for _, t := range r.AllowedTargets {
			switch {
			case t == "all":
				a.AllowedTargets = slices.Clone(TargetTypes)
			case slices.Contains(TargetTypes, t):
				if !slices.Contains(a.AllowedTargets, t) {
					a.AllowedTargets = append(a.AllowedTargets, t)
				}
			default:
				return nil, fmt.Errorf("%s.allowed_targets: %q is not one of %s or all", key, t, strings.Join(TargetTypes, ", "))
			}
		}
		agents[id] = a
	}
	return agents, nil
}
