package service_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/conclave-ai/conclave/pkg/testenv"
	covenpb "github.com/conclave-ai/conclave/proto/coven"
)

// The REST JSON as docs/gateway-clients.md ("The client API") writes it, for
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
	// restMessage is one line (or one event's data) of a SendMessage
	// stream: the first carries the request_id (event null), sent as soon
	// as the message is queued; every later one an event.
	restMessage struct {
		RequestID string     `json:"request_id"`
		Event     *restEvent `json:"event"`
		ThreadID  string     `json:"thread_id"`
		EntryID   string     `json:"entry_id"`
		Replayed  bool       `json:"replayed"`
	}
	restCancel struct {
		Cancelled bool `json:"cancelled"`
	}
	restAttachmentRef struct {
		Filename string `json:"filename"`
		MimeType string `json:"mime_type"`
		Size     int    `json:"size"`
		SHA256   string `json:"sha256"`
	}
	// restEntry has one of message, event and outcome.
	restEntry struct {
		EntryID   string    `json:"entry_id"`
		ThreadID  string    `json:"thread_id"`
		RequestID string    `json:"request_id"`
		AgentID   string    `json:"agent_id"`
		Time      time.Time `json:"time"`
		Message   *struct {
			Sender      string              `json:"sender"`
			Content     string              `json:"content"`
			Attachments []restAttachmentRef `json:"attachments"`
			ClientID    string              `json:"client_id"`
		} `json:"message"`
		Event   *restEvent `json:"event"`
		Outcome *struct {
			Ending  string `json:"ending"`
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"outcome"`
		File *restAttachmentRef `json:"file"`
	}
	restHistory struct {
		Entries       []restEntry `json:"entries"`
		NextPageToken string      `json:"next_page_token"`
	}
	restThreads struct {
		Threads []struct {
			ThreadID  string    `json:"thread_id"`
			AgentID   string    `json:"agent_id"`
			ClientID  string    `json:"client_id"`
			StartedAt time.Time `json:"started_at"`
		} `json:"threads"`
		NextPageToken string `json:"next_page_token"`
	}
	restWatchLine struct {
		Entry restEntry `json:"entry"`
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
	conn, base := startTuned(t, "gw-json", openStore(t), withHistory(nil))
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
		resp, b := testenv.Do(t, req)
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

	// Newline-delimited JSON: one SendMessageResponse a line, the first
	// without an event.
	var requestID, threadID string
	var lines []restMessage
	for line := range strings.Lines(string(call("POST", "/v1/agents/plain/messages", `{"content":"x","attachments":[{"filename":"a.txt","data":"YWJj"}]}`, ""))) {
		var l restMessage
		decode("stream line", []byte(line), &l)
		if first := len(lines) == 0; first != (l.Event == nil) {
			t.Errorf("stream line %d: event %v; only the first, and always the first, carries none", len(lines), l.Event)
		}
		requestID, threadID = l.RequestID, l.ThreadID
		lines = append(lines, l)
	}
	if len(lines) != 7 || lines[0].EntryID == "" || threadID == "" {
		t.Errorf("%d stream lines, want the request_id's and 6 events, the first naming its entry and thread: %+v", len(lines), lines)
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
	var h restHistory
	decode("GET /v1/threads/{thread_id}/messages", call("GET", "/v1/threads/"+threadID+"/messages", "", ""), &h)
	if len(h.Entries) != 8 || h.Entries[0].Message == nil || len(h.Entries[0].Message.Attachments) != 1 || h.Entries[7].Outcome == nil || h.Entries[7].Outcome.Ending != "ENDING_DONE" {
		t.Errorf("history: %+v", h)
	}
	var threads restThreads
	decode("GET /v1/agents/{agent_id}/threads", call("GET", "/v1/agents/plain/threads", "", ""), &threads)
	if len(threads.Threads) != 2 {
		t.Errorf("threads: %+v", threads)
	}
	watched := 0
	for line := range strings.Lines(string(call("GET", "/v1/threads/"+threadID+"/watch", "", ""))) {
		decode("watch line", []byte(line), &restWatchLine{})
		watched++
	}
	if watched != 8 {
		t.Errorf("%d watched entries, want 8", watched)
	}
	// An EventSource that reconnects sends the last id it saw: the watch
	// resumes after it, each event's id its entry_id.
	if len(h.Entries) == 8 {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/threads/"+threadID+"/watch", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Last-Event-ID", h.Entries[3].EntryID)
		resp, b := testenv.Do(t, req)
		var ids []string
		for line := range strings.Lines(string(b)) {
			if id, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "id: "); ok {
				ids = append(ids, id)
			}
		}
		var want []string
		for _, e := range h.Entries[4:] {
			want = append(want, e.EntryID)
		}
		if resp.StatusCode != http.StatusOK || strings.Join(ids, ",") != strings.Join(want, ",") {
			t.Errorf("watch resumed after Last-Event-ID %s: %d, ids %v, want %v\n%s", h.Entries[3].EntryID, resp.StatusCode, ids, want, b)
		}
	}
	var c restCancel
	decode("cancel", call("POST", "/v1/requests/"+requestID+"/cancel", `{}`, ""), &c)
	if c.Cancelled {
		t.Errorf("a finished request was cancelled")
	}
}
