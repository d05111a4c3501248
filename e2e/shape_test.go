package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// shape is one way of deploying the system, as the scenario sees it: where
// each service answers and with which tokens, how to run the bus's command
// line, how to read each service's logs, and how to tell which service a
// span of a trace came from. A shape's test starts the shape and hands it
// to runScenario; the steps use nothing else.
type shape struct {
	name string

	// gatewayHTTP is the client API's base URL (REST and SSE);
	// gatewayGRPC the agents' host:port (coven.CovenControl/AgentStream).
	gatewayHTTP, gatewayGRPC string
	// gatewayToken is a client token ("" when none is needed);
	// covenAgentToken the example coven agent's own token.
	gatewayToken, covenAgentToken string
	// covenAgentID is the id the coven agent registers under (an agent
	// token is bound to one id).
	covenAgentID string

	// busURL is the bus's ws:// URL; busToken a token allowed every topic
	// and the dead-letter API ("" when none is needed).
	busURL, busToken string
	// bub runs the bus's command line (`conclave bus` or `bub`) with the
	// given arguments, pointed at the bus with busToken.
	bub func(ctx context.Context, args ...string) *exec.Cmd

	// runnerHTTP is the runner's REST base URL; runnerToken a client token.
	runnerHTTP, runnerToken string
	// workspace is a directory under the runner's workspace roots.
	workspace string

	// bridgeMCP is the bridge's streamable HTTP endpoint (…/mcp);
	// bridgeToken a token for it.
	bridgeMCP, bridgeToken string

	// librarianURL is the Librarian's public base URL; librarianAgentToken
	// claude-3's token, reviewerToken a reviewer's ("" when none is
	// needed: conclave dev opens both the API and the review page).
	librarianURL, librarianAgentToken, reviewerToken string

	// agentsRemote: the runner's ACP agents run elsewhere (Jobs' pods),
	// their workspaces out of this host's reach.
	agentsRemote bool

	// console is the console's base URL, pointed at the test's Jaeger, and
	// consoleToken a token to sign in with ("" when the shape runs none).
	console, consoleToken string

	// logs are the services' logs, for the report of a failed step.
	logs []*logSource
	// serviceOf names the service a span comes from (gateway, bus, runner,
	// bridge, librarian), or "" for a span of none of them (the test's
	// own, say).
	serviceOf func(testenv.JaegerSpan) string
}

// logSource is a log the failure report can show part of.
type logSource struct {
	name string
	read func() string
}

// addLog adds a log to the report of a failed step, and returns a func
// that takes it out again (for a process of one step's).
func (s *shape) addLog(name string, read func() string) (remove func()) {
	l := &logSource{name: name, read: read}
	s.logs = append(s.logs, l)
	return func() { s.logs = slices.DeleteFunc(s.logs, func(x *logSource) bool { return x == l }) }
}

// The services of the scenario, as serviceOf names them.
const (
	gateway   = "gateway"
	bus       = "bus"
	runner    = "runner"
	bridge    = "bridge"
	librarian = "librarian"
)

// serviceByProcess is serviceOf for shapes where each deployable is a
// process of its own, reporting its own service.name: the span's process
// tells.
func serviceByProcess(names map[string]string) func(testenv.JaegerSpan) string {
	return func(s testenv.JaegerSpan) string { return names[s.ServiceName] }
}

// serviceInOneProcess is serviceOf for `conclave dev`, where every service
// shares one process and so one service.name ("conclave"). A server span
// (HTTP or gRPC) belongs to the service whose listener served it, which
// its server.port tells (ports maps each listener's port to its service);
// the services' own spans (the bus's publish, delivery and redrive, the
// runner's agent start and ACP calls, the gateway's in-process client API
// calls) and the queue consumers' spans
// (named after the queue, which the service consuming it owns) by their
// names. Client spans belong to no service here: a gRPC client span to the
// runner may be the bus's.
func serviceInOneProcess(ports map[string]string) func(testenv.JaegerSpan) string {
	return func(s testenv.JaegerSpan) string {
		if s.Tags["span.kind"] == "server" {
			if p, ok := s.Tags["server.port"]; ok {
				if name := ports[fmt.Sprint(p)]; name != "" {
					return name
				}
			}
		}
		// The gateway's in-process client API calls (REST, A2A) are named
		// after the gRPC method they call, under its tracer.
		if s.Tags["otel.scope.name"] == "github.com/conclave-ai/conclave/services/gateway/internal/clientapi" {
			return gateway
		}
		for _, r := range spanNames {
			if s.OperationName == r.name || (r.prefix && strings.HasPrefix(s.OperationName, r.name)) {
				return r.service
			}
		}
		return ""
	}
}

// spanNames are the names of the spans the services make themselves.
var spanNames = []struct {
	name    string
	prefix  bool
	service string
}{
	{"bus publish", false, bus},
	{"bus deliver ", true, bus},
	{"bus redrive", false, bus},
	{"bus-retries process", false, bus},
	{"bus-events process", false, bus},
	{"runner-launches", true, runner},
	{"start agent", false, runner},
	{"acp ", true, runner},
	// pkg/govern's: the runner's, in this scenario (the bridge's governed
	// tools make them too).
	{"librarian approval", false, runner},
	{"librarian decision", false, runner},
	{"gateway message turn", false, runner},
}

// services lists the services a trace has spans from, sorted.
func (s *shape) services(t *testenv.JaegerTrace) []string {
	var out []string
	for _, sp := range t.Spans {
		if name := s.serviceOf(sp); name != "" && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// describe lists a trace's spans, one a line, for a failure message.
func (s *shape) describe(t *testenv.JaegerTrace) string {
	if t == nil {
		return "  (no trace)\n"
	}
	var b strings.Builder
	for _, sp := range t.Spans {
		fmt.Fprintf(&b, "  %s %-40q process %-20s service %-10s parent %s", sp.SpanID, sp.OperationName, sp.ServiceName, s.serviceOf(sp), sp.ParentSpanID)
		for _, k := range []string{"otel.scope.name", "otel.library.name", "span.kind", "http.route", "server.port", "net.host.port", "url.path", "rpc.service"} {
			if v, ok := sp.Tags[k]; ok {
				fmt.Fprintf(&b, " %s=%v", k, v)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
