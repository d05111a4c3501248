package service

import (
	"context"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/executor"
	"github.com/conclave-ai/conclave/services/runner/internal/hostlink"
	"github.com/conclave-ai/conclave/services/runner/internal/metrics"
	"github.com/conclave-ai/conclave/services/runner/internal/supervisor"
)

// hostLinks gives the supervisor the hub's links to agent-host, and
// agent-host its settings, for agents the Kubernetes executor runs.
type hostLinks struct {
	hub *hostlink.Hub
	key []byte
	// runnerAddr is where agent-host dials this replica's gRPC listener;
	// it is known once the listener is bound.
	runnerAddr func() string
	// settings are agent-host's settings common to every launch.
	settings hostlink.Settings
	// otlp is where agent-host exports its spans, if anywhere.
	otlp string
	// gatewayAddr is where agent-host dials the gateway to register an
	// agent on it; empty: agents behind agent-host are not registered.
	gatewayAddr      string
	gatewayHeartbeat time.Duration
}

var (
	_ supervisor.HostLinks = (*hostLinks)(nil)
	_ hostlink.HubMetrics  = (*metrics.Metrics)(nil)
)

func (h *hostLinks) Expect(instanceID string, launch int64, hh supervisor.HostHandlers) supervisor.HostLink {
	var decide func(context.Context, hostlink.PermissionRequest) acp.PermissionAnswer
	if hh.OnPermission != nil {
		decide = func(ctx context.Context, p hostlink.PermissionRequest) acp.PermissionAnswer {
			return hh.OnPermission(ctx, p.Params, p.Workspace, int(p.Turn))
		}
	}
	return hostLink{h.hub.Expect(instanceID, launch, hostlink.LinkOptions{
		OnUpdate:     hh.OnUpdate,
		OnPermission: decide,
		OnLog: func(stream, text string) {
			if stream == "stderr" {
				hh.OnLog(supervisor.StreamStderr, text)
				return
			}
			hh.OnLog(supervisor.StreamRunner, "agent-host: "+text)
		},
		OnGatewayMessage: hh.OnGatewayMessage,
		OnGatewayCancel:  hh.OnGatewayCancel,
	})}
}

func (h *hostLinks) Spec(instanceID string, launch int64, typ agenttype.Type, sessionID string, gw supervisor.GatewayAgent) executor.HostSpec {
	s := h.settings
	s.RunnerAddr, s.InstanceID, s.Launch = h.runnerAddr(), instanceID, launch
	s.Protocol, s.Permission, s.AuthMethod, s.SessionID = typ.Protocol, typ.Permission, typ.AuthMethod, sessionID
	if gw.AgentID != "" && h.gatewayAddr != "" {
		// The token is not here: the executor references the operator's
		// Secret for it (CONCLAVE_RUNNER_KUBE_GATEWAY_TOKEN_SECRET).
		s.GatewayAddr, s.GatewayAgentID, s.GatewayName, s.GatewayCapabilities = h.gatewayAddr, gw.AgentID, gw.Name, gw.Capabilities
		s.GatewayHeartbeat, s.AgentType = h.gatewayHeartbeat, gw.AgentType
	}
	env := s.Env()
	if h.otlp != "" {
		env["OTEL_EXPORTER_OTLP_ENDPOINT"] = h.otlp
	}
	return executor.HostSpec{Env: env, Token: hostlink.Token(h.key, instanceID)}
}

// hostLink is a hostlink.Link as the supervisor converses with it.
type hostLink struct{ *hostlink.Link }

var _ supervisor.HostLink = hostLink{}

func (l hostLink) Ready(ctx context.Context) (sessionID, dialect string, err error) {
	r, err := l.Link.Ready(ctx)
	return r.SessionID, r.Dialect, err
}

func (l hostLink) Close() { _ = l.Link.Close() }
