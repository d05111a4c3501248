package supervisor

import (
	"fmt"
	"slices"
	"testing"
	"time"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// gatewayHostLink is a launch's link to agent-host that records what the
// session tells it for the gateway.
type gatewayHostLink struct {
	HostLink
	told []string
}

func (l *gatewayHostLink) GatewayTurnEnded(turn int, end, errText string) {
	l.told = append(l.told, fmt.Sprintf("turn %d ended %s %q", turn, end, errText))
}

func (l *gatewayHostLink) GatewayToolState(turn int, id string, state covenpb.ToolState, detail string) {
	l.told = append(l.told, fmt.Sprintf("turn %d tool %s %s %q", turn, id, state, detail))
}

// TestHostGatewayWord: an agent whose agent-host holds its registration at
// the gateway (a Job's) is told the runner's own word on its turns over
// the link: a permission waiting for a person, the decision, and how the
// turn ended, as the runner's own registration would be. An instance not
// on the gateway, or a runner whose agent-hosts do not register agents,
// tells it nothing.
func TestHostGatewayWord(t *testing.T) {
	t.Parallel()
	registry, err := agenttype.New(
		agenttype.Type{ID: "front", Command: []string{"agent"}, Protocol: agenttype.ProtocolACP, Enabled: true, Timeout: time.Minute, Gateway: true},
		agenttype.Type{ID: "back", Command: []string{"agent"}, Protocol: agenttype.ProtocolACP, Enabled: true, Timeout: time.Minute},
	)
	if err != nil {
		t.Fatal(err)
	}
	all := []string{
		`turn 3 tool call_1 TOOL_STATE_AWAITING_APPROVAL "waiting for a person"`,
		`turn 3 tool call_1 TOOL_STATE_RUNNING "permission approved"`,
		`turn 3 ended completed ""`,
	}
	for _, tt := range []struct {
		name        string
		hostGateway bool
		agentType   string
		metadata    map[string]any
		want        []string
	}{
		{name: "its type is on the gateway", hostGateway: true, agentType: "front", want: all},
		{name: "its launch is on the gateway", hostGateway: true, agentType: "back", metadata: map[string]any{MetadataGateway: true}, want: all},
		{name: "not on the gateway", hostGateway: true, agentType: "back"},
		{name: "agent-host does not register agents", agentType: "front"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			link := &gatewayHostLink{}
			ss := &session{
				s:      &Supervisor{o: Options{Registry: registry, HostGateway: tt.hostGateway}},
				launch: records.Instance{ID: "inst", AgentType: tt.agentType, Metadata: tt.metadata},
				link:   link,
			}
			ss.gatewayToolState(3, "call_1", covenpb.ToolState_TOOL_STATE_AWAITING_APPROVAL, "waiting for a person")
			ss.gatewayToolState(3, "call_1", covenpb.ToolState_TOOL_STATE_RUNNING, "permission approved")
			ss.gatewayTurnEnded(3, "completed", "")
			if !slices.Equal(link.told, tt.want) {
				t.Fatalf("agent-host was told %q, want %q", link.told, tt.want)
			}
		})
	}
}
