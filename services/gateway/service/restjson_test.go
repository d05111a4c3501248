package service_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/conclave-ai/conclave/pkg/testenv"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// The REST JSON as docs/gateway.md ("The client API") writes it, for
// clients written from that text rather than from our protos.
type (
	restAgent struct {
		AgentID          string          `json:"agent_id"`
		Name             string          `json:"name"`
		Capabilities     []string        `json:"capabilities"`
		Metadata         *map[string]any `json:"metadata"`
		ProtocolFeatures []string        `json:"protocol_features"`
		ServerID         string          `json:"server_id"`
		InstanceID       string          `json:"instance_id"`
		ConnectedAt      time.Time       `json:"connected_at"`
		LastSeenAt       time.Time       `json:"last_seen_at"`
		QueuedRequests   int             `json:"queued_requests"`
		Busy             bool            `json:"busy"`
	}
	restList struct {
		Agents        []restAgent `json:"agents"`
		NextPageToken string      `json:"next_page_token"`
	}
	// restEvent has one member besides request_id: the event the agent
	// sent.
	restEvent struct {
		RequestID string  `json:"request_id"`
		Thinking  *string `json:"thinking"`
		Text      *string `json:"text"`
		Error     *string `json:"error"`
		ToolUse   *struct {
			ID        string `json:"id"`
			Name      string `json:"name"`
			InputJSON string `json:"input_json"`
		} `json:"tool_use"`
		ToolResult *struct {
			ID      string `json:"id"`
			Output  string `json:"output"`
			IsError bool   `json:"is_error"`
		} `json:"tool_result"`
		Done *struct {
			FullResponse string `json:"full_response"`
		} `json:"done"`
		File *struct {
			Filename string `json:"filename"`
			MimeType string `json:"mime_type"`
			Data     string `json:"data"`
		} `json:"file"`
		SessionInit *struct {
			SessionID string `json:"session_id"`
		} `json:"session_init"`
		Usage *struct {
			InputTokens      int `json:"input_tokens"`
			OutputTokens     int `json:"output_tokens"`
			CacheReadTokens  int `json:"cache_read_tokens"`
			CacheWriteTokens int `json:"cache_write_tokens"`
			ThinkingTokens   int `json:"thinking_tokens"`
		} `json:"usage"`
		ToolState *struct {
			ID     string  `json:"id"`
			State  string  `json:"state"`
			Detail *string `json:"detail"`
		} `json:"tool_state"`
		Cancelled *struct {
			Reason string `json:"reason"`
		} `json:"cancelled"`
	}
	// restMessage is one SendMessage response: the first carries only
	// the request_id (event null), sent as soon as the message is queued;
	// every later one an event.
	restMessage struct {
		RequestID string     `json:"request_id"`
		Event     *restEvent `json:"event"`
	}
	restStreamLine struct {
		Result restMessage `json:"result"`
	}
	restCancel struct {
		Cancelled bool `json:"cancelled"`
	}
)

// plainAgent registers id with nothing but its id, and answers every
// message with events whose fields are all zero values, the ones protojson
// leaves out unless told otherwise.
func plainAgent(t *testing.T, ctx context.Context, conn *grpc.ClientConn) {
	t.Helper()
	stream, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: "plain"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("register: %v %v", m, err)
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			req := m.GetSendMessage()
			if req == nil {
				continue
			}
			id := req.RequestId
			for _, r := range []*covenpb.MessageResponse{
				{RequestId: id, Event: &covenpb.MessageResponse_Text{Text: "hi"}},
				{RequestId: id, Event: &covenpb.MessageResponse_ToolUse{ToolUse: &covenpb.ToolUse{Id: "t1", Name: "clock"}}},
				{RequestId: id, Event: &covenpb.MessageResponse_ToolResult{ToolResult: &covenpb.ToolResult{Id: "t1"}}},
				{RequestId: id, Event: &covenpb.MessageResponse_Usage{Usage: &covenpb.TokenUsage{}}},
				{RequestId: id, Event: &covenpb.MessageResponse_ToolState{ToolState: &covenpb.ToolStateUpdate{Id: "t1"}}},
				{RequestId: id, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{}}},
			} {
				if stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: r}}) != nil {
					return
				}
			}
		}
	}()
}

// TestRESTJSONTypes decodes real REST answers strictly into the documented
// types: every member present (capabilities and the other lists as [],
// busy and the zero numbers written), each of its JSON type.
func TestRESTJSONTypes(t *testing.T) {
	t.Parallel()
	conn, base := startGateway(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plainAgent(t, ctx, conn)

	call := func(method, path, body, accept string) []byte {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return b
	}
	decode := func(what string, raw []byte, into any) {
		t.Helper()
		if err := testenv.DecodeProtocol(raw, into); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}

	var list restList
	decode("GET /v1/agents", call("GET", "/v1/agents", "", ""), &list)
	if len(list.Agents) != 1 || list.Agents[0].AgentID != "plain" {
		t.Errorf("agents %+v", list)
	}
	var none restList
	decode("GET /v1/agents?capability=none", call("GET", "/v1/agents?capability=none", "", ""), &none)
	decode("GET /v1/agents/plain", call("GET", "/v1/agents/plain", "", ""), &restAgent{})

	// grpc-gateway's stream: one {"result": ...} a line.
	var requestID string
	lines := 0
	for line := range strings.Lines(string(call("POST", "/v1/agents/plain/messages", `{"content":"x"}`, ""))) {
		var l restStreamLine
		decode("stream line", []byte(line), &l)
		if first := lines == 0; first != (l.Result.Event == nil) {
			t.Errorf("stream line %d: event %v; only the first, and always the first, carries none", lines, l.Result.Event)
		}
		requestID = l.Result.RequestID
		lines++
	}
	if lines != 7 {
		t.Errorf("%d stream lines, want the request_id's and 6 events", lines)
	}
	// Server-Sent Events: each message's data.
	events := 0
	sc := bufio.NewScanner(strings.NewReader(string(call("POST", "/v1/agents/plain/messages", `{"content":"x"}`, "text/event-stream"))))
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && data != "{}" {
			var m restMessage
			decode("event", []byte(data), &m)
			if first := events == 0; first != (m.Event == nil) {
				t.Errorf("event %d: %v; only the first, and always the first, carries none", events, m.Event)
			}
			events++
		}
	}
	if events != 7 {
		t.Errorf("%d events, want the request_id's and 6 more", events)
	}
	var c restCancel
	decode("cancel", call("POST", "/v1/requests/"+requestID+"/cancel", `{}`, ""), &c)
	if c.Cancelled {
		t.Errorf("a finished request was cancelled")
	}
}
