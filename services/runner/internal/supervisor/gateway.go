package supervisor

import (
	"context"
	"runtime"

	"go.opentelemetry.io/otel/trace"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/covenlink"
)

// Launch metadata that puts an instance on the gateway, whatever its
// type says, and names it there.
const (
	MetadataGateway        = "gateway"
	MetadataGatewayAgentID = "gateway_agent_id"
)

// GatewayAgentID is the coven agent_id an instance registers under, and
// whether it registers at all: its type's gateway, or its launch's
// metadata, asks for it.
func GatewayAgentID(typ agenttype.Type, instanceID string, md map[string]any) (string, bool) {
	on, _ := md[MetadataGateway].(bool)
	if !typ.Gateway && !on {
		return "", false
	}
	if id, _ := md[MetadataGatewayAgentID].(string); id != "" {
		return id, true
	}
	return instanceID, true
}

// gatewayCaps are a type's capabilities at the gateway.
func gatewayCaps(typ agenttype.Type) []string {
	if len(typ.Capabilities) == 0 {
		return []string{"chat"}
	}
	return typ.Capabilities
}

// hostGateway is what the launch's agent-host registers at the gateway:
// none unless agent-host registers agents (HostGateway) and the instance
// asks for it.
func (ss *session) hostGateway(typ agenttype.Type) GatewayAgent {
	if !ss.s.o.HostGateway {
		return GatewayAgent{}
	}
	id, ok := GatewayAgentID(typ, ss.launch.ID, ss.launch.Metadata)
	if !ok {
		return GatewayAgent{}
	}
	return GatewayAgent{AgentID: id, Name: firstNonEmpty(typ.Name, typ.ID), AgentType: ss.launch.AgentType, Capabilities: gatewayCaps(typ)}
}

// openGateway registers the session's agent at the gateway, when the
// runner has one and the instance asks for it: once its session is up, so
// that a message never waits on the agent's start. An agent behind
// agent-host that registers it is left to agent-host.
func (ss *session) openGateway() {
	typ, _ := ss.s.o.Registry.Get(ss.launch.AgentType)
	id, ok := GatewayAgentID(typ, ss.launch.ID, ss.launch.Metadata)
	if !ok {
		return
	}
	ss.mu.Lock()
	hosted := ss.link != nil
	ss.mu.Unlock()
	if hosted {
		// Its agent-host registers it, from where it runs.
		if !ss.s.o.HostGateway {
			ss.log.Add(StreamRunner, "not registered at the gateway: this runner has no CONCLAVE_RUNNER_HOST_GATEWAY_ADDR or CONCLAVE_RUNNER_GATEWAY_ADDR")
		}
		return
	}
	g := ss.s.o.Gateway
	if g == nil {
		ss.log.Add(StreamRunner, "not registered at the gateway: this runner has no CONCLAVE_RUNNER_GATEWAY_ADDR")
		return
	}
	caps := gatewayCaps(typ)
	where := ss.s.o.GatewayHost
	l := g.Open(covenlink.Agent{
		ID: id, Name: firstNonEmpty(typ.Name, typ.ID), Capabilities: caps,
		Metadata: &covenpb.AgentMetadata{
			WorkingDirectory: ss.launch.Workspace, Hostname: where, Os: runtime.GOOS, Backend: "acp",
			// Tags for filtering: that the runner runs it, which instance
			// and type it is.
			Workspaces: []string{"runner", "instance:" + ss.launch.ID, "agent_type:" + ss.launch.AgentType},
		},
		Prompt: func(ctx context.Context, message string, accepted func(int)) error {
			// The turn continues the gateway client's trace, which ctx
			// carries (SendMessage's trace_context).
			return ss.promptAccepted(ctx, message, trace.SpanContextFromContext(ctx), accepted)
		},
		Cancel: ss.cancel,
		Note:   func(text string) { ss.log.Add(StreamRunner, text) },
	})
	ss.mu.Lock()
	ss.coven = l
	ss.mu.Unlock()
}

// closeGateway deregisters the session's agent as its process ends; a
// message in flight ends with error, saying why.
func (ss *session) closeGateway(outcome, reason string) {
	ss.mu.Lock()
	l := ss.coven
	ss.coven = nil
	ss.mu.Unlock()
	if l == nil {
		return
	}
	why := firstNonEmpty(reason, outcome, "the agent's process ended")
	if kind, killed := ss.killedWhy(); kind != stopNone {
		why = killed
	}
	l.Close(why)
}

func (ss *session) gateway() *covenlink.Link {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.coven
}

// gatewayUpdate hands an update of the turn in progress to the gateway.
func (ss *session) gatewayUpdate(u acp.Update) {
	if l := ss.gateway(); l != nil {
		ss.mu.Lock()
		turn := ss.curTurn
		ss.mu.Unlock()
		l.Update(turn, u)
	}
}

// gatewayToolState tells the gateway, for turn's request, the state of a
// tool call that the runner itself knows (a permission wait for a person):
// over the runner's own registration, or the agent-host's that holds it.
func (ss *session) gatewayToolState(turn int, id string, state covenpb.ToolState, detail string) {
	if l := ss.gateway(); l != nil {
		l.ToolState(turn, id, state, detail)
		return
	}
	if link := ss.hostGatewayLink(); link != nil {
		link.GatewayToolState(turn, id, state, detail)
	}
}

// gatewayTurnEnded tells the gateway how turn ended, as recorded.
func (ss *session) gatewayTurnEnded(turn int, status, errText string) {
	if l := ss.gateway(); l != nil {
		l.TurnEnded(turn, status, errText)
		return
	}
	if link := ss.hostGatewayLink(); link != nil {
		link.GatewayTurnEnded(turn, status, errText)
	}
}

// hostGatewayLink is the link to the session's agent-host when that holds
// the agent's registration at the gateway (the instance is on it), else
// nil. What it is told of a turn that no gateway request asked for is
// ignored there.
func (ss *session) hostGatewayLink() HostLink {
	ss.mu.Lock()
	link := ss.link
	ss.mu.Unlock()
	if link == nil || !ss.s.o.HostGateway {
		return nil
	}
	typ, _ := ss.s.o.Registry.Get(ss.launch.AgentType)
	if _, ok := GatewayAgentID(typ, ss.launch.ID, ss.launch.Metadata); !ok {
		return nil
	}
	return link
}
