package service

import (
	"context"
	"encoding/json"

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
}

var (
	_ supervisor.HostLinks = (*hostLinks)(nil)
	_ hostlink.HubMetrics  = (*metrics.Metrics)(nil)
)

func (h *hostLinks) Expect(instanceID string, launch int64, onUpdate func(context.Context, acp.Update), onLog func(stream, text string),
	onPermission func(context.Context, json.RawMessage, string, int) acp.PermissionAnswer) supervisor.HostLink {
	var decide func(context.Context, hostlink.PermissionRequest) acp.PermissionAnswer
	if onPermission != nil {
		decide = func(ctx context.Context, p hostlink.PermissionRequest) acp.PermissionAnswer {
			return onPermission(ctx, p.Params, p.Workspace, int(p.Turn))
		}
	}
	return hostLink{h.hub.Expect(instanceID, launch, hostlink.LinkOptions{
		OnUpdate:     onUpdate,
		OnPermission: decide,
		OnLog: func(stream, text string) {
			if stream == "stderr" {
				onLog(supervisor.StreamStderr, text)
				return
			}
			onLog(supervisor.StreamRunner, "agent-host: "+text)
		},
	})}
}

func (h *hostLinks) Spec(instanceID string, launch int64, typ agenttype.Type, sessionID string) executor.HostSpec {
	s := h.settings
	s.RunnerAddr, s.InstanceID, s.Launch = h.runnerAddr(), instanceID, launch
	s.Protocol, s.Permission, s.AuthMethod, s.SessionID = typ.Protocol, typ.Permission, typ.AuthMethod, sessionID
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
