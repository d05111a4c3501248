// Package handler builds the Librarian's one http.Handler: the Lambda
// (internal/lambdafn) serves it behind API Gateway, and package service over
// plain HTTP for functions/librarian/cmd/local and `conclave dev`. It links
// no server, exporter or gRPC code (telemetry comes in as an OpenTelemetry
// MeterProvider and an HTTP wrapper), so that the Lambda's cold start pays
// only for what a Lambda runs.
package handler

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/conclave-ai/conclave/functions/librarian/config"
	"github.com/conclave-ai/conclave/functions/librarian/internal/access"
	"github.com/conclave-ai/conclave/functions/librarian/internal/api"
	"github.com/conclave-ai/conclave/functions/librarian/internal/events"
	"github.com/conclave-ai/conclave/functions/librarian/internal/governance"
	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/functions/librarian/internal/ratelimit"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/functions/librarian/internal/review"
	"github.com/conclave-ai/conclave/functions/librarian/internal/stats"
	"github.com/conclave-ai/conclave/functions/librarian/templates"
	"github.com/conclave-ai/conclave/pkg/auth"
	pkgconfig "github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/httpguard"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
)

// Config is the Librarian's configuration.
type Config struct {
	HTTPAddr        pkgconfig.ListenAddr `env:"CONCLAVE_LIBRARIAN_HTTP_ADDR" default:":8081" help:"HTTP listener of the local server (the Lambda has none)"`
	ConfigDir       string               `env:"CONCLAVE_LIBRARIAN_CONFIG_DIR" help:"directory holding agents.yaml and protocol.yaml (default: the files built in)"`
	BaseURL         string               `env:"CONCLAVE_LIBRARIAN_BASE_URL" help:"public URL of the API, for human_review_url (default: from each request's Host)"`
	APIRate         string               `env:"CONCLAVE_LIBRARIAN_API_RATE" default:"60/minute" help:"requests each agent may make to the API, beside its own registry limit"`
	ReadRate        string               `env:"CONCLAVE_LIBRARIAN_READ_RATE" default:"600/minute" help:"reads (status, capabilities, reviews, metrics) each caller may make"`
	AgentTokens     []string             `env:"CONCLAVE_LIBRARIAN_AGENT_TOKENS" help:"comma-separated agent_id=token pairs accepted beside the tokens in the store"`
	ReviewerTokens  []string             `env:"CONCLAVE_LIBRARIAN_REVIEWER_TOKENS" help:"comma-separated name=token pairs of reviewers, beside the tokens in the store"`
	ShutdownTimeout time.Duration        `env:"CONCLAVE_LIBRARIAN_SHUTDOWN_TIMEOUT" default:"10s" validate:"positive" help:"how long in-flight requests may drain on shutdown"`
	SweepInterval   time.Duration        `env:"CONCLAVE_LIBRARIAN_SWEEP_INTERVAL" default:"1m" help:"how often the local server rejects escalations past timeouts.escalation that nobody reads ; 0 turns it off (the Lambda runs on its EventBridge schedule instead)"`
	// AllowUnauthenticated lets callers without a token act as the agent
	// they name, and review; conclave dev sets it, on loopback only.
	AllowUnauthenticated bool `env:"CONCLAVE_LIBRARIAN_ALLOW_UNAUTHENTICATED" default:"false" help:"serve without bearer tokens (development only)"`
	// AllowedHosts are answered besides loopback names while the local
	// server runs without authentication.
	AllowedHosts []string `env:"CONCLAVE_LIBRARIAN_ALLOWED_HOSTS" help:"comma-separated Host names the local server answers besides localhost, 127.0.0.1 and [::1] while it runs without authentication"`
	// AuthThrottle is the per-address budget of wrong tokens (pkg/auth.Throttle).
	AuthThrottle auth.ThrottleSetting `env:"CONCLAVE_LIBRARIAN_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens one address may present: BURST at once, then one more each EVERY (BURST/EVERY); past it, callers get 429 with Retry-After"`
}

// Validate implements config.Validator.
func (c Config) Validate() error {
	if err := pkgconfig.Check(c); err != nil {
		return err
	}
	if _, err := policy.ParseRate(c.APIRate); err != nil {
		return fmt.Errorf("CONCLAVE_LIBRARIAN_API_RATE: %w", err)
	}
	if _, err := policy.ParseRate(c.ReadRate); err != nil {
		return fmt.Errorf("CONCLAVE_LIBRARIAN_READ_RATE: %w", err)
	}
	var s access.Static
	if err := access.ParseStatic(c.AgentTokens, access.RoleAgent, &s); err != nil {
		return fmt.Errorf("CONCLAVE_LIBRARIAN_AGENT_TOKENS: %w", err)
	}
	if err := access.ParseStatic(c.ReviewerTokens, access.RoleReviewer, &s); err != nil {
		return fmt.Errorf("CONCLAVE_LIBRARIAN_REVIEWER_TOKENS: %w", err)
	}
	if c.AllowUnauthenticated {
		// The Lambda has no listener, but API Gateway puts it on a
		// network all the same: it refuses this setting too.
		if err := httpguard.CheckListen("CONCLAVE_LIBRARIAN_HTTP_ADDR", string(c.HTTPAddr), "CONCLAVE_LIBRARIAN_ALLOW_UNAUTHENTICATED"); err != nil {
			return err
		}
	}
	if c.BaseURL != "" && !strings.HasPrefix(c.BaseURL, "https://") && !strings.HasPrefix(c.BaseURL, "http://") {
		return fmt.Errorf("CONCLAVE_LIBRARIAN_BASE_URL: %q is not an http(s) URL", c.BaseURL)
	}
	if c.SweepInterval < 0 {
		return fmt.Errorf("CONCLAVE_LIBRARIAN_SWEEP_INTERVAL: must not be negative, got %s", c.SweepInterval)
	}
	return nil
}

// Tables lists the tables the Librarian keeps its state in.
var Tables = []store.Table{requests.Table, graph.Table, ratelimit.Table, access.Table}

// Queues lists the queues it sends to.
var Queues = []queue.Definition{events.Queue}

// Deps are what the handler runs on.
type Deps struct {
	Store  store.Store
	Queue  queue.Queue
	Logger *slog.Logger
	// Meters makes the domain metrics (docs/metrics.md); nil counts none.
	Meters metric.MeterProvider
	// Instrument wraps the handler in HTTP tracing (nil: none): otelhttp
	// bound to the process's tracer provider.
	Instrument func(http.Handler) http.Handler
	// Now is the clock of decisions and escalation deadlines (nil:
	// time.Now); tests move it forward.
	Now func() time.Time
	// Agents are added to the registry when it lacks them, as agents that
	// may ask about every target type (policy.AddAgent): conclave dev's
	// governed agent types.
	Agents []string
	// AwaitOutboxClear makes each submission's answer wait for the write
	// that clears its published events: the Lambda sets it, since a frozen
	// execution environment runs nothing after the answer. Elsewhere that
	// write goes on after the answer.
	AwaitOutboxClear bool
}

// Librarian is the handler and the parts other surfaces reach into.
type Librarian struct {
	// Handler serves every route.
	Handler http.Handler
	// SweepEscalations rejects the escalated requests past
	// timeouts.escalation and returns how many; reads do it too, this
	// catches those nobody reads.
	SweepEscalations func(context.Context) (int, error)
	// Policy is the loaded agents.yaml and protocol.yaml.
	Policy *policy.Policy
	// Graph is the knowledge graph, for seeding it.
	Graph *graph.Graph
}

// New loads the configuration files and builds the handler. It makes no
// network call: the store, queue and telemetry are used only by requests.
func New(cfg Config, d Deps) (*Librarian, error) {
	var fsys fs.FS = config.Files
	dir := "(built-in) config"
	if cfg.ConfigDir != "" {
		fsys, dir = os.DirFS(cfg.ConfigDir), cfg.ConfigDir
	}
	pol, err := policy.Load(fsys, dir)
	if err != nil {
		return nil, err
	}
	for _, id := range d.Agents {
		pol.AddAgent(id)
	}
	tpl, err := templates.Load()
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	apiRate, err := policy.ParseRate(cfg.APIRate)
	if err != nil {
		return nil, fmt.Errorf("CONCLAVE_LIBRARIAN_API_RATE: %w", err)
	}
	readRate := policy.Rate{Count: 600, Window: time.Minute}
	if cfg.ReadRate != "" {
		if readRate, err = policy.ParseRate(cfg.ReadRate); err != nil {
			return nil, fmt.Errorf("CONCLAVE_LIBRARIAN_READ_RATE: %w", err)
		}
	}
	var static access.Static
	if err := access.ParseStatic(cfg.AgentTokens, access.RoleAgent, &static); err != nil {
		return nil, fmt.Errorf("CONCLAVE_LIBRARIAN_AGENT_TOKENS: %w", err)
	}
	if err := access.ParseStatic(cfg.ReviewerTokens, access.RoleReviewer, &static); err != nil {
		return nil, fmt.Errorf("CONCLAVE_LIBRARIAN_REVIEWER_TOKENS: %w", err)
	}
	logger := d.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.AllowUnauthenticated {
		logger.Warn("the Librarian accepts requests without a bearer token")
	}
	g := graph.New(d.Store)
	reqs := requests.New(d.Store, d.Now)
	limiter := ratelimit.New(d.Store, apiRate, nil)
	tokens := access.New(d.Store)
	var observer api.Observer
	var throttled func(context.Context)
	if d.Meters != nil {
		m, err := newMetrics(d.Meters)
		if err != nil {
			return nil, err
		}
		observer, throttled = m, m.AuthThrottled
	}
	h := api.New(api.Options{
		Policy:   pol,
		Pipeline: governance.NewPipeline(governance.Deps{Graph: g, Limiter: limiter, Requests: reqs, Templates: tpl}),
		Limiter:  limiter, Reads: limiter, ReadRate: readRate, Requests: reqs, Graph: g, Tokens: tokens, Static: &static,
		Events: events.NewPublisher(d.Queue), Stats: stats.New(d.Store), Observer: observer, Logger: logger,
		BaseURL: cfg.BaseURL, AllowUnauthenticated: cfg.AllowUnauthenticated, Now: d.Now,
		Throttle:         auth.NewThrottle(cfg.AuthThrottle.Options(throttled)),
		AwaitOutboxClear: d.AwaitOutboxClear,
	})
	review.Register(h.Mux(), h, review.Options{Secure: strings.HasPrefix(cfg.BaseURL, "https://"), AllowUnauthenticated: cfg.AllowUnauthenticated})
	var handler http.Handler = h
	if d.Instrument != nil {
		handler = d.Instrument(h)
	}
	return &Librarian{Handler: handler, SweepEscalations: h.SweepEscalations, Policy: pol, Graph: g}, nil
}
