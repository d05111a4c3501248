package hostlink

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

// Bounds on what agent-host sends, checked before anything is done with it.
const (
	maxInstanceID = 128
	maxLinkID     = 64
	// MaxMessageBytes bounds one gRPC message either way: the runner's gRPC
	// server's default (pkg/server.DefaultMaxRecvMsgSize). agent-host cuts
	// an event that would be larger (fitEvent), so that one huge line
	// cannot wedge the link.
	MaxMessageBytes = 4 << 20
	minHeartbeat    = 100 * time.Millisecond
	maxHeartbeat    = 5 * time.Minute
	// DefaultHeartbeat is how often each side sends a Heartbeat when the
	// host's Hello names none.
	DefaultHeartbeat = 10 * time.Second
)

// validID: 1-max printable ASCII, no spaces (instance ids are UUIDs; host and
// link ids are hex).
func validID(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// checkHello validates a stream's first message and returns the heartbeat
// interval it asks for.
func checkHello(m *runnerv1.ConnectRequest) (*runnerv1.Hello, time.Duration, error) {
	h := m.GetHello()
	if h == nil {
		return nil, 0, errors.New("the first message must be a hello")
	}
	switch {
	case !validID(h.GetInstanceId(), maxInstanceID):
		return nil, 0, errors.New("hello: instance_id must be 1-128 printable ASCII characters without spaces")
	case h.GetLaunch() < 1:
		return nil, 0, fmt.Errorf("hello: launch must be at least 1, not %d", h.GetLaunch())
	case !validID(h.GetHostId(), maxLinkID):
		return nil, 0, errors.New("hello: host_id must be 1-64 printable ASCII characters without spaces")
	case h.GetLinkId() != "" && !validID(h.GetLinkId(), maxLinkID):
		return nil, 0, errors.New("hello: link_id must be empty or 1-64 printable ASCII characters without spaces")
	case h.GetLastCommandSeq() < 0:
		return nil, 0, errors.New("hello: last_command_seq must not be negative")
	}
	beat := DefaultHeartbeat
	if d := h.GetHeartbeatInterval(); d != nil {
		if err := d.CheckValid(); err != nil {
			return nil, 0, fmt.Errorf("hello: heartbeat_interval: %w", err)
		}
		beat = d.AsDuration()
		if beat < minHeartbeat || beat > maxHeartbeat {
			return nil, 0, fmt.Errorf("hello: heartbeat_interval must be within %s and %s, not %s", minHeartbeat, maxHeartbeat, beat)
		}
	}
	return h, beat, nil
}

// checkEvent validates an event from the host. (Strings need no check:
// protobuf refuses a message whose strings are not UTF-8.)
func checkEvent(e *runnerv1.HostEvent) error {
	if e.GetSeq() < 1 {
		return fmt.Errorf("event: seq must be at least 1, not %d", e.GetSeq())
	}
	switch k := e.GetKind().(type) {
	case *runnerv1.HostEvent_Ready, *runnerv1.HostEvent_Log, *runnerv1.HostEvent_Exited:
		return nil
	case *runnerv1.HostEvent_Update:
		if p := k.Update.GetProgress(); p < -1 || p > 100 {
			return fmt.Errorf("event %d: update.progress must be -1 or 0-100, not %d", e.GetSeq(), p)
		}
		if k.Update.GetKind() == "" {
			return fmt.Errorf("event %d: update.kind is empty", e.GetSeq())
		}
		return nil
	case *runnerv1.HostEvent_TurnEnded:
		if k.TurnEnded.GetTurn() < 1 {
			return fmt.Errorf("event %d: turn_ended.turn must be at least 1, not %d", e.GetSeq(), k.TurnEnded.GetTurn())
		}
		return nil
	case *runnerv1.HostEvent_PermissionRequest:
		p := k.PermissionRequest
		switch {
		case p.GetId() < 1:
			return fmt.Errorf("event %d: permission_request.id must be at least 1, not %d", e.GetSeq(), p.GetId())
		case !json.Valid(p.GetParams()) || len(p.GetParams()) == 0 || p.GetParams()[0] != '{':
			return fmt.Errorf("event %d: permission_request.params must be a JSON object", e.GetSeq())
		case p.GetWorkspace() != "" && !filepath.IsAbs(p.GetWorkspace()):
			return fmt.Errorf("event %d: permission_request.workspace must be an absolute path", e.GetSeq())
		case p.GetTurn() < 0:
			return fmt.Errorf("event %d: permission_request.turn must not be negative", e.GetSeq())
		}
		return nil
	case *runnerv1.HostEvent_GatewayMessage:
		if !validID(k.GatewayMessage.GetRequestId(), maxLinkID) {
			return fmt.Errorf("event %d: gateway_message.request_id must be 1-64 printable ASCII characters without spaces", e.GetSeq())
		}
		return nil
	case *runnerv1.HostEvent_GatewayCancel:
		return nil
	default:
		return fmt.Errorf("event %d: no kind", e.GetSeq())
	}
}
