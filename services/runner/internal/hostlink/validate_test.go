package hostlink

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
)

func TestToken(t *testing.T) {
	t.Parallel()
	a := Token([]byte("key"), "inst-1")
	if a != Token([]byte("key"), "inst-1") {
		t.Fatal("Token is not deterministic")
	}
	for _, other := range []string{Token([]byte("key"), "inst-2"), Token([]byte("other"), "inst-1")} {
		if other == a {
			t.Fatal("tokens of another instance or key collide")
		}
	}
	if !validToken([]byte("key"), "inst-1", a) || validToken([]byte("key"), "inst-2", a) || validToken([]byte("key"), "inst-1", "") {
		t.Fatal("validToken")
	}
}

func TestCheckHello(t *testing.T) {
	t.Parallel()
	ok := func() *runnerv1.Hello {
		return &runnerv1.Hello{InstanceId: "inst", Launch: 1, HostId: "abc", HeartbeatInterval: durationpb.New(time.Second)}
	}
	for _, tc := range []struct {
		name  string
		edit  func(h *runnerv1.Hello)
		valid bool
	}{
		{"valid", func(*runnerv1.Hello) {}, true},
		{"no instance", func(h *runnerv1.Hello) { h.InstanceId = "" }, false},
		{"space in instance", func(h *runnerv1.Hello) { h.InstanceId = "a b" }, false},
		{"launch 0", func(h *runnerv1.Hello) { h.Launch = 0 }, false},
		{"no host id", func(h *runnerv1.Hello) { h.HostId = "" }, false},
		{"negative command seq", func(h *runnerv1.Hello) { h.LastCommandSeq = -1 }, false},
		{"heartbeat too fast", func(h *runnerv1.Hello) { h.HeartbeatInterval = durationpb.New(time.Millisecond) }, false},
		{"no heartbeat", func(h *runnerv1.Hello) { h.HeartbeatInterval = nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := ok()
			tc.edit(h)
			_, _, err := checkHello(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_Hello{Hello: h}})
			if (err == nil) != tc.valid {
				t.Fatalf("checkHello = %v, want valid %v", err, tc.valid)
			}
		})
	}
	if _, _, err := checkHello(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_Heartbeat{}}); err == nil {
		t.Fatal("a first message that is not a hello passed")
	}
}

// FuzzConnectRequest feeds arbitrary bytes, as a host's message, through
// what the hub does with one: decode, then check it as a hello and as an
// event. Nothing panics, and what passes holds the invariants the hub
// relies on.
func FuzzConnectRequest(f *testing.F) {
	for _, m := range []*runnerv1.ConnectRequest{
		{Message: &runnerv1.ConnectRequest_Hello{Hello: &runnerv1.Hello{InstanceId: "inst", Launch: 2, HostId: "h", LinkId: "l", LastCommandSeq: 3}}},
		{Message: &runnerv1.ConnectRequest_Event{Event: &runnerv1.HostEvent{Seq: 1, Kind: &runnerv1.HostEvent_Update{Update: &runnerv1.AgentUpdate{Kind: "content", Text: "hi", Progress: -1, Raw: []byte(`{}`)}}}}},
		{Message: &runnerv1.ConnectRequest_Event{Event: &runnerv1.HostEvent{Seq: 2, Kind: &runnerv1.HostEvent_TurnEnded{TurnEnded: &runnerv1.TurnEnded{Turn: 1, StopReason: "end_turn"}}}}},
		{Message: &runnerv1.ConnectRequest_Event{Event: &runnerv1.HostEvent{Seq: 3, Kind: &runnerv1.HostEvent_Exited{Exited: &runnerv1.Exited{ExitCode: 3}}}}},
		{Message: &runnerv1.ConnectRequest_CommandAck{CommandAck: &runnerv1.CommandAck{Seq: 4}}},
		{Message: &runnerv1.ConnectRequest_Event{Event: &runnerv1.HostEvent{Seq: 5, Kind: &runnerv1.HostEvent_PermissionRequest{PermissionRequest: &runnerv1.PermissionRequest{
			Id: 1, Params: []byte(`{"sessionId":"s","toolCall":{"toolCallId":"c"},"options":[]}`), Workspace: "/workspace"}}}}},
		{Message: &runnerv1.ConnectRequest_Event{Event: &runnerv1.HostEvent{Seq: 6, Kind: &runnerv1.HostEvent_GatewayMessage{GatewayMessage: &runnerv1.GatewayMessage{
			RequestId: "1", Content: "hello", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}}},
		{Message: &runnerv1.ConnectRequest_Event{Event: &runnerv1.HostEvent{Seq: 7, Kind: &runnerv1.HostEvent_GatewayCancel{GatewayCancel: &runnerv1.GatewayCancel{Reason: "gave up"}}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x03, 0xff, 0xfe, 0xfd})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m runnerv1.ConnectRequest
		if err := proto.Unmarshal(data, &m); err != nil {
			return
		}
		if h, beat, err := checkHello(&m); err == nil {
			if h.GetLaunch() < 1 || !validID(h.GetInstanceId(), maxInstanceID) || !validID(h.GetHostId(), maxLinkID) || beat < minHeartbeat || beat > maxHeartbeat {
				t.Fatalf("accepted a bad hello: %v (heartbeat %s)", h, beat)
			}
		}
		if e := m.GetEvent(); e != nil {
			if err := checkEvent(e); err == nil {
				if e.GetSeq() < 1 {
					t.Fatalf("accepted seq %d", e.GetSeq())
				}
				if u := e.GetUpdate(); u != nil && (u.GetProgress() < -1 || u.GetProgress() > 100 || u.GetKind() == "") {
					t.Fatalf("accepted a bad update: %v", u)
				}
				if te := e.GetTurnEnded(); te != nil && te.GetTurn() < 1 {
					t.Fatalf("accepted turn %d", te.GetTurn())
				}
				if p := e.GetPermissionRequest(); p != nil && (p.GetId() < 1 || !json.Valid(p.GetParams()) || p.GetParams()[0] != '{' ||
					p.GetWorkspace() != "" && !filepath.IsAbs(p.GetWorkspace())) {
					t.Fatalf("accepted a bad permission request: %v", p)
				}
				if g := e.GetGatewayMessage(); g != nil && !validID(g.GetRequestId(), maxLinkID) {
					t.Fatalf("accepted a bad gateway message: %v", g)
				}
			}
		}
	})
}

// An event too large for one message is cut to fit, its text still UTF-8.
func TestFitEvent(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("é", MaxMessageBytes) // two bytes each
	for _, e := range []*runnerv1.HostEvent{
		{Seq: 1, Kind: &runnerv1.HostEvent_Update{Update: &runnerv1.AgentUpdate{Kind: "content", Text: big, Raw: []byte(`"` + big + `"`)}}},
		{Seq: 2, Kind: &runnerv1.HostEvent_Update{Update: &runnerv1.AgentUpdate{Kind: "content", Text: big[:MaxMessageBytes], Raw: []byte(`{}`)}}},
		{Seq: 3, Kind: &runnerv1.HostEvent_Log{Log: &runnerv1.AgentLog{Stream: "stderr", Text: big}}},
	} {
		if !fitEvent(e) {
			t.Fatalf("event %d was not cut", e.GetSeq())
		}
		b, err := proto.Marshal(&runnerv1.ConnectRequest{Message: &runnerv1.ConnectRequest_Event{Event: e}})
		if err != nil {
			t.Fatalf("event %d: %v", e.GetSeq(), err)
		}
		if len(b) > MaxMessageBytes {
			t.Fatalf("event %d is %d bytes, over %d", e.GetSeq(), len(b), MaxMessageBytes)
		}
	}
	small := &runnerv1.HostEvent{Seq: 4, Kind: &runnerv1.HostEvent_Log{Log: &runnerv1.AgentLog{Text: "short"}}}
	if fitEvent(small) || small.GetLog().GetText() != "short" {
		t.Fatal("a small event was cut")
	}
}

// The gateway settings are checked only when there is a gateway, and go
// into an executor's environment without the token, which a Secret holds.
func TestGatewaySettings(t *testing.T) {
	t.Parallel()
	base := Settings{RunnerAddr: "runner:50052", Token: "t", InstanceID: "inst-1", Launch: 1, Permission: "deny",
		BufferBytes: 1 << 20, MaxLine: 1 << 20, BackoffMin: time.Millisecond, BackoffMax: time.Second, GiveUp: time.Minute,
		Heartbeat: time.Second, ProtocolTimeout: time.Second, KillGrace: time.Second}
	for _, tt := range []struct {
		name string
		set  func(*Settings)
		want string // in the error; "" for none
	}{
		{"no gateway: nothing checked", func(s *Settings) { s.GatewayAgentID = "bad id" }, ""},
		{"a gateway with defaults", func(s *Settings) { s.GatewayAddr = "gw:50051" }, ""},
		{"an agent id with a space", func(s *Settings) { s.GatewayAddr, s.GatewayAgentID = "gw:50051", "bad id" }, "CONCLAVE_AGENT_HOST_GATEWAY_AGENT_ID"},
		{"a long name", func(s *Settings) { s.GatewayAddr, s.GatewayName = "gw:50051", strings.Repeat("n", 257) }, "CONCLAVE_AGENT_HOST_GATEWAY_NAME"},
		{"a bad capability", func(s *Settings) { s.GatewayAddr, s.GatewayCapabilities = "gw:50051", []string{"chat", ""} }, "CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES"},
		{"too many capabilities", func(s *Settings) {
			s.GatewayAddr = "gw:50051"
			for range 33 {
				s.GatewayCapabilities = append(s.GatewayCapabilities, "c")
			}
		}, "at most 32"},
		{"a negative heartbeat", func(s *Settings) { s.GatewayAddr, s.GatewayHeartbeat = "gw:50051", -time.Second }, "CONCLAVE_AGENT_HOST_GATEWAY_HEARTBEAT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			tt.set(&s)
			err := s.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate: %v, want an error naming %s", err, tt.want)
			}
		})
	}
	s := base
	s.GatewayAddr, s.GatewayToken, s.GatewayAgentID, s.GatewayCapabilities = "gw:50051", "the-secret", "front", []string{"chat", "code"}
	env := s.Env()
	if env["CONCLAVE_AGENT_HOST_GATEWAY_ADDR"] != "gw:50051" || env["CONCLAVE_AGENT_HOST_GATEWAY_AGENT_ID"] != "front" ||
		env["CONCLAVE_AGENT_HOST_GATEWAY_CAPABILITIES"] != "chat,code" {
		t.Fatalf("Env: %v", env)
	}
	for k, v := range env {
		if v == "the-secret" || k == "CONCLAVE_AGENT_HOST_GATEWAY_TOKEN" {
			t.Fatalf("Env holds the gateway token as %s", k)
		}
	}
	if s.gatewayAgentID() != "front" || base.gatewayAgentID() != "inst-1" {
		t.Fatal("gatewayAgentID: the setting, else the instance id")
	}
}
