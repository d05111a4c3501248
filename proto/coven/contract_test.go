package covenpb_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// covenFields is the coven protocol's contract plus its extensions (marked
// "Extension:" in coven.proto) at the public coven protocol's field numbers.
// A renumbered, renamed or retyped field fails here, because the expectation
// is checked against the compiled descriptor, not the Go code.
var covenFields = map[string][]struct {
	name   string
	number protowire.Number
	kind   protoreflect.Kind
	list   bool
	oneof  string
}{
	"AgentMessage": {
		{"register", 1, protoreflect.MessageKind, false, "payload"},
		{"response", 2, protoreflect.MessageKind, false, "payload"},
		{"heartbeat", 3, protoreflect.MessageKind, false, "payload"},
	},
	"RegisterAgent": {
		{"agent_id", 1, protoreflect.StringKind, false, ""},
		{"name", 2, protoreflect.StringKind, false, ""},
		{"capabilities", 3, protoreflect.StringKind, true, ""},
		{"metadata", 4, protoreflect.MessageKind, false, ""},
		{"protocol_features", 5, protoreflect.StringKind, true, ""},
	},
	"MessageResponse": {
		{"request_id", 1, protoreflect.StringKind, false, ""},
		{"thinking", 2, protoreflect.StringKind, false, "event"},
		{"text", 3, protoreflect.StringKind, false, "event"},
		{"tool_use", 4, protoreflect.MessageKind, false, "event"},
		{"tool_result", 5, protoreflect.MessageKind, false, "event"},
		{"done", 6, protoreflect.MessageKind, false, "event"},
		{"error", 7, protoreflect.StringKind, false, "event"},
		{"file", 8, protoreflect.MessageKind, false, "event"},
		{"session_init", 10, protoreflect.MessageKind, false, "event"},
		{"usage", 12, protoreflect.MessageKind, false, "event"},
		{"tool_state", 13, protoreflect.MessageKind, false, "event"},
		{"cancelled", 14, protoreflect.MessageKind, false, "event"},
	},
	"Heartbeat": {
		{"timestamp_ms", 1, protoreflect.Int64Kind, false, ""},
	},
	"ServerMessage": {
		{"welcome", 1, protoreflect.MessageKind, false, "payload"},
		{"send_message", 2, protoreflect.MessageKind, false, "payload"},
		{"shutdown", 3, protoreflect.MessageKind, false, "payload"},
		{"registration_error", 5, protoreflect.MessageKind, false, "payload"},
		{"cancel_request", 7, protoreflect.MessageKind, false, "payload"},
	},
	"Welcome": {
		{"server_id", 1, protoreflect.StringKind, false, ""},
		{"agent_id", 2, protoreflect.StringKind, false, ""},
		{"instance_id", 3, protoreflect.StringKind, false, ""},
	},
	"SendMessage": {
		{"request_id", 1, protoreflect.StringKind, false, ""},
		{"thread_id", 2, protoreflect.StringKind, false, ""},
		{"sender", 3, protoreflect.StringKind, false, ""},
		{"content", 4, protoreflect.StringKind, false, ""},
		{"attachments", 5, protoreflect.MessageKind, true, ""},
		// Conclave's own, at a number far from the public protocol's: the
		// client's trace context (docs/gateway.md).
		{"trace_context", 1000, protoreflect.MessageKind, false, ""},
	},
	"FileAttachment": {
		{"filename", 1, protoreflect.StringKind, false, ""},
		{"mime_type", 2, protoreflect.StringKind, false, ""},
		{"data", 3, protoreflect.BytesKind, false, ""},
	},
	"Shutdown": {
		{"reason", 1, protoreflect.StringKind, false, ""},
	},
	"ToolUse": {
		{"id", 1, protoreflect.StringKind, false, ""},
		{"name", 2, protoreflect.StringKind, false, ""},
		{"input_json", 3, protoreflect.StringKind, false, ""},
	},
	"ToolResult": {
		{"id", 1, protoreflect.StringKind, false, ""},
		{"output", 2, protoreflect.StringKind, false, ""},
		{"is_error", 3, protoreflect.BoolKind, false, ""},
	},
	"Done": {
		{"full_response", 1, protoreflect.StringKind, false, ""},
	},
	"FileData": {
		{"filename", 1, protoreflect.StringKind, false, ""},
		{"mime_type", 2, protoreflect.StringKind, false, ""},
		{"data", 3, protoreflect.BytesKind, false, ""},
	},
}

func TestCovenDescriptorMatchesProtocol(t *testing.T) {
	t.Parallel()
	file := covenpb.File_coven_coven_proto
	if got := file.Package(); got != "coven" {
		t.Fatalf("package = %q, want coven", got)
	}
	svc := file.Services().ByName("CovenControl")
	if svc == nil {
		t.Fatal("service coven.CovenControl missing")
	}
	rpc := svc.Methods().ByName("AgentStream")
	if rpc == nil {
		t.Fatal("rpc AgentStream missing")
	}
	if !rpc.IsStreamingClient() || !rpc.IsStreamingServer() {
		t.Error("AgentStream must be bidirectional streaming")
	}
	if got := rpc.Input().FullName(); got != "coven.AgentMessage" {
		t.Errorf("AgentStream input = %s", got)
	}
	if got := rpc.Output().FullName(); got != "coven.ServerMessage" {
		t.Errorf("AgentStream output = %s", got)
	}

	for msgName, fields := range covenFields {
		t.Run(msgName, func(t *testing.T) {
			t.Parallel()
			md := file.Messages().ByName(protoreflect.Name(msgName))
			if md == nil {
				t.Fatalf("message %s missing", msgName)
			}
			if md.Fields().Len() != len(fields) {
				t.Errorf("%s has %d fields, the contract lists %d", msgName, md.Fields().Len(), len(fields))
			}
			for _, want := range fields {
				fd := md.Fields().ByName(protoreflect.Name(want.name))
				if fd == nil {
					t.Errorf("%s.%s missing", msgName, want.name)
					continue
				}
				if fd.Number() != want.number {
					t.Errorf("%s.%s number = %d, want %d", msgName, want.name, fd.Number(), want.number)
				}
				if fd.Kind() != want.kind {
					t.Errorf("%s.%s kind = %s, want %s", msgName, want.name, fd.Kind(), want.kind)
				}
				if fd.IsList() != want.list {
					t.Errorf("%s.%s repeated = %v, want %v", msgName, want.name, fd.IsList(), want.list)
				}
				var oneof string
				if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() {
					oneof = string(o.Name())
				}
				if oneof != want.oneof {
					t.Errorf("%s.%s oneof = %q, want %q", msgName, want.name, oneof, want.oneof)
				}
			}
		})
	}
}

// TestCovenWireRoundTrip encodes every coven message, checks the exact bytes of
// a hand-assembled encoding (so the Go types and the wire agree), and decodes
// it back.
func TestCovenWireRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  proto.Message
		// wire is the expected encoding, assembled from field numbers.
		wire []byte
	}{
		{
			name: "register",
			msg: &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{
				AgentId: "a1", Name: "n", Capabilities: []string{"chat", "code"},
			}}},
			wire: msg(1, cat(str(1, "a1"), str(2, "n"), str(3, "chat"), str(3, "code"))),
		},
		{
			name: "heartbeat",
			msg:  &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Heartbeat{Heartbeat: &covenpb.Heartbeat{TimestampMs: 1700000000000}}},
			wire: msg(3, varint(1, 1700000000000)),
		},
		{name: "response thinking", msg: resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_Thinking{Thinking: "hm"}}), wire: msg(2, cat(str(1, "r"), str(2, "hm")))},
		{name: "response text", msg: resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_Text{Text: "hi"}}), wire: msg(2, cat(str(1, "r"), str(3, "hi")))},
		{
			name: "response tool_use",
			msg:  resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{Id: "t", Name: "ls", InputJson: "{}"}}}),
			wire: msg(2, cat(str(1, "r"), msg(4, cat(str(1, "t"), str(2, "ls"), str(3, "{}"))))),
		},
		{
			name: "response tool_result",
			msg:  resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{Id: "t", Output: "ok", IsError: true}}}),
			wire: msg(2, cat(str(1, "r"), msg(5, cat(str(1, "t"), str(2, "ok"), varint(3, 1))))),
		},
		{
			name: "response done",
			msg:  resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: "all"}}}),
			wire: msg(2, cat(str(1, "r"), msg(6, str(1, "all")))),
		},
		{name: "response error", msg: resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_Error{Error: "boom"}}), wire: msg(2, cat(str(1, "r"), str(7, "boom")))},
		{
			name: "response file",
			msg:  resp(&covenpb.MessageResponse{RequestId: "r", Event: &covenpb.MessageResponse_File{File: &covenpb.FileData{Filename: "f", MimeType: "text/plain", Data: []byte("x")}}}),
			wire: msg(2, cat(str(1, "r"), msg(8, cat(str(1, "f"), str(2, "text/plain"), str(3, "x"))))),
		},
		{
			name: "welcome",
			msg:  &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Welcome{Welcome: &covenpb.Welcome{ServerId: "s", AgentId: "a"}}},
			wire: msg(1, cat(str(1, "s"), str(2, "a"))),
		},
		{
			name: "send_message",
			msg: &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_SendMessage{SendMessage: &covenpb.SendMessage{
				RequestId: "r", ThreadId: "th", Sender: "me", Content: "c",
				Attachments: []*covenpb.FileAttachment{{Filename: "a.txt", MimeType: "text/plain", Data: []byte("d")}},
			}}},
			wire: msg(2, cat(str(1, "r"), str(2, "th"), str(3, "me"), str(4, "c"), msg(5, cat(str(1, "a.txt"), str(2, "text/plain"), str(3, "d"))))),
		},
		{
			name: "shutdown",
			msg:  &covenpb.ServerMessage{Payload: &covenpb.ServerMessage_Shutdown{Shutdown: &covenpb.Shutdown{Reason: "bye"}}},
			wire: msg(3, str(1, "bye")),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := proto.MarshalOptions{Deterministic: true}.Marshal(tt.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			if string(got) != string(tt.wire) {
				t.Fatalf("encoding differs from coven's field numbers:\n got  %x\n want %x", got, tt.wire)
			}
			decoded := tt.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(tt.wire, decoded); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if !proto.Equal(decoded, tt.msg) {
				t.Fatalf("round trip changed the message:\n got  %v\n want %v", decoded, tt.msg)
			}
		})
	}
}

// TestCovenProtocolJSONExample decodes the registration example printed in the coven
// protocol's text.
func TestCovenProtocolJSONExample(t *testing.T) {
	t.Parallel()
	const protocolExample = `{
  "register": {
    "agent_id": "550e8400-e29b-41d4-a716-446655440000",
    "name": "mux-agent-1",
    "capabilities": ["chat"]
  }
}`
	var m covenpb.AgentMessage
	if err := protojson.Unmarshal([]byte(protocolExample), &m); err != nil {
		t.Fatalf("decode coven example: %v", err)
	}
	reg := m.GetRegister()
	if reg.GetAgentId() != "550e8400-e29b-41d4-a716-446655440000" || reg.GetName() != "mux-agent-1" ||
		len(reg.GetCapabilities()) != 1 || reg.GetCapabilities()[0] != "chat" {
		t.Fatalf("decoded %v", reg)
	}
}

func resp(r *covenpb.MessageResponse) *covenpb.AgentMessage {
	return &covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}}
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func str(num protowire.Number, s string) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func msg(num protowire.Number, body []byte) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(b, body)
}

func varint(num protowire.Number, v uint64) []byte {
	b := protowire.AppendTag(nil, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}
