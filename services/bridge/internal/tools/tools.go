// Package tools runs the configured tool agents: schema and hybrid-protocol validation,
// the hybrid protocol, logging and metrics. It knows nothing of MCP, so that
// `conclave bridge run` and the MCP server call agents the same way.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/services/bridge/internal/agentconfig"
)

// Outcomes of a call, the values of the outcome label: success, agent_error
// (the agent answered {"status":"error"}), or a hybrid.Kind.
const (
	OutcomeSuccess    = "success"
	OutcomeAgentError = "agent_error"
)

// Outcomes lists every outcome label value.
func Outcomes() []string {
	out := []string{OutcomeSuccess, OutcomeAgentError}
	for _, k := range hybrid.Kinds {
		out = append(out, string(k))
	}
	return out
}

// Runner calls the agents of one configuration.
type Runner struct {
	cfg     *agentconfig.Config
	log     *slog.Logger
	calls   metric.Int64Counter
	seconds metric.Float64Histogram
	invalid metric.Int64Counter
	running metric.Int64UpDownCounter
	// slots holds one token per agent running; a call that finds it full is
	// refused rather than queued, so a burst of calls cannot fork without
	// bound and the client learns at once.
	slots chan struct{}
	// gov asks the Librarian before a governed tool runs.
	gov Governance
}

// New returns a Runner for cfg that runs at most maxRunning agents at once.
// meter may be nil (no metrics).
func New(cfg *agentconfig.Config, logger *slog.Logger, meter metric.Meter, maxRunning int) (*Runner, error) {
	if meter == nil {
		meter = noop.NewMeterProvider().Meter("bridge")
	}
	if maxRunning < 1 {
		maxRunning = 1
	}
	r := &Runner{cfg: cfg, log: logger, slots: make(chan struct{}, maxRunning)}
	var err error
	if r.calls, err = meter.Int64Counter(telemetry.MetricName("bridge", "tool_calls"),
		metric.WithDescription("Tool calls by tool and outcome."), metric.WithUnit("{call}")); err != nil {
		return nil, err
	}
	if r.seconds, err = meter.Float64Histogram(telemetry.MetricName("bridge", "tool_call_duration"),
		metric.WithDescription("How long tool calls take, validation to parsed output."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)); err != nil {
		return nil, err
	}
	if r.invalid, err = meter.Int64Counter(telemetry.MetricName("bridge", "validation_failures"),
		metric.WithDescription("Calls rejected before execution, by validation rule."), metric.WithUnit("{call}")); err != nil {
		return nil, err
	}
	if r.running, err = meter.Int64UpDownCounter(telemetry.MetricName("bridge", "agents_running"),
		metric.WithDescription("Agent processes running now."), metric.WithUnit("{agent}")); err != nil {
		return nil, err
	}
	return r, nil
}

// Config is the configuration the Runner calls agents of.
func (r *Runner) Config() *agentconfig.Config { return r.cfg }

// UnknownToolError is returned by Call for a name that is no configured tool.
type UnknownToolError struct{ Name string }

func (e *UnknownToolError) Error() string {
	return fmt.Sprintf("unknown tool %q", e.Name)
}

// Call runs tool name with args, its parameters as a JSON object. It returns
// the agent's response (which may be an agent-side error) or an error: an
// *UnknownToolError, or a *hybrid.Error for every bridge-side failure.
func (r *Runner) Call(ctx context.Context, name string, args json.RawMessage) (*hybrid.Response, error) {
	a, ok := r.cfg.Agent(name)
	if !ok {
		return nil, &UnknownToolError{Name: name}
	}
	start := time.Now()
	resp, err := r.call(ctx, a, args)
	outcome := OutcomeSuccess
	switch {
	case err != nil:
		outcome = string(hybrid.KindOf(err))
	case resp.Status == hybrid.StatusError:
		outcome = OutcomeAgentError
	}
	elapsed := time.Since(start)
	attrs := metric.WithAttributes(attribute.String("tool", name), attribute.String("outcome", outcome))
	r.calls.Add(ctx, 1, attrs)
	r.seconds.Record(ctx, elapsed.Seconds(), attrs)
	if err != nil {
		var e *hybrid.Error
		if errors.As(err, &e) && e.Kind == hybrid.KindValidation {
			r.invalid.Add(ctx, 1, metric.WithAttributes(attribute.String("rule", e.Rule)))
		}
		r.log.WarnContext(ctx, "tool call failed", "tool", name, "outcome", outcome, "duration", elapsed, "error", err)
	} else {
		r.log.InfoContext(ctx, "tool call completed", "tool", name, "outcome", outcome, "duration", elapsed)
	}
	return resp, err
}

func (r *Runner) call(ctx context.Context, a *agentconfig.Agent, args json.RawMessage) (*hybrid.Response, error) {
	params, err := hybrid.DecodeParams(args)
	if err != nil {
		return nil, err
	}
	if r.cfg.ValidateInputs {
		// The hybrid protocol's rules first: they are the specific ones (a 1 MB string
		// is "too long", not "does not match the schema").
		if err := hybrid.Validate(params, r.cfg.MaxParamLength); err != nil {
			return nil, err
		}
	}
	var plain any
	if err := json.Unmarshal(orEmptyObject(args), &plain); err != nil {
		return nil, &hybrid.Error{Kind: hybrid.KindValidation, Rule: hybrid.RuleParams, Message: err.Error(), ExitCode: -1}
	}
	if err := a.ValidateSchema(plain); err != nil {
		return nil, err
	}
	if a.Governed {
		// Before the slot: a wait for a person holds no agent's place.
		if err := r.approve(ctx, a, params, args); err != nil {
			return nil, err
		}
	}
	run := a.Run // a copy: Stderr is per call
	run.ValidateInputs = false
	run.Stderr = func(line string) {
		r.log.InfoContext(ctx, "agent stderr", "tool", a.Name, "line", line)
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Parameter names only: values may be anything, secrets included.
	r.log.InfoContext(ctx, "dispatching tool", "tool", a.Name, "params", keys, "bytes", len(args))
	select {
	case r.slots <- struct{}{}:
	default:
		return nil, &hybrid.Error{Kind: hybrid.KindBusy, ExitCode: -1,
			Message: fmt.Sprintf("%d agents are running already, the limit (CONCLAVE_BRIDGE_MAX_RUNNING); retry later", cap(r.slots))}
	}
	defer func() { <-r.slots }()
	r.running.Add(ctx, 1)
	defer r.running.Add(context.WithoutCancel(ctx), -1)
	return hybrid.Run(ctx, &run, params)
}

func orEmptyObject(b json.RawMessage) json.RawMessage {
	for _, c := range b {
		if c != ' ' && c != '\n' && c != '\t' && c != '\r' {
			return b
		}
	}
	return json.RawMessage("{}")
}

// AgentHealth is one agent's health: whether it can be started.
type AgentHealth struct {
	Script      string   `json:"script"`
	Interpreter string   `json:"interpreter"`
	Timeout     string   `json:"timeout"`
	Healthy     bool     `json:"healthy"`
	Problems    []string `json:"problems,omitempty"`
}

// Health is the bridge's health: every agent's.
type Health struct {
	Healthy   bool                   `json:"healthy"`
	Config    string                 `json:"config"`
	Workspace string                 `json:"workspace"`
	Agents    map[string]AgentHealth `json:"agents"`
}

// Health checks, for every agent, that its script and interpreter exist and
// are usable.
func (r *Runner) Health() Health {
	h := Health{Healthy: true, Config: r.cfg.File, Workspace: r.cfg.Workspace, Agents: map[string]AgentHealth{}}
	for _, a := range r.cfg.Agents {
		ah := AgentHealth{Script: a.Run.Script, Interpreter: a.Run.Interpreter, Timeout: a.Run.Timeout.String(), Healthy: true}
		for _, p := range a.Run.Problems() {
			ah.Healthy = false
			ah.Problems = append(ah.Problems, p.Error())
		}
		h.Healthy = h.Healthy && ah.Healthy
		h.Agents[a.Name] = ah
	}
	return h
}

// Names lists the tools, sorted.
func (r *Runner) Names() []string {
	names := make([]string, 0, len(r.cfg.Agents))
	for _, a := range r.cfg.Agents {
		names = append(names, a.Name)
	}
	return slices.Sorted(slices.Values(names))
}
