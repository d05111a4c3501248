package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	covenpb "github.com/conclave-ai/conclave/proto/coven"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// FuzzRESTBodies: whatever body a client sends to the REST API's routes
// that take one, the gateway answers without a 5xx, and every error is a
// google.rpc.Status. One gateway serves every input.
func FuzzRESTBodies(f *testing.F) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	cfg := testConfig("gw-fuzz")
	// Every input is one request; the limits are not what is fuzzed.
	cfg.ClientRate, cfg.ClientBurst, cfg.ClientStreams = 1e9, 1e9, 1e6
	_, base := startWith(f, cfg, openStore(f), tel)
	routes := []struct{ method, path, accept string }{
		{"POST", "/v1/agents/ghost/messages", "application/json"},
		{"POST", "/v1/agents/ghost/messages", "text/event-stream"},
		{"POST", "/v1/requests/gw-fuzz.1/cancel", "application/json"},
	}
	for _, body := range []string{
		`{"content":"hi","thread_id":"t1","sender":"s"}`, `{"content":5}`, `{`, `[]`, `null`, `""`, ``,
		`{"thread_id":"a\u0000b"}`, `{"attachments":[{"filename":"f","data":"!!"}]}`, `{"idempotency_key":"` + strings.Repeat("k", 200) + `"}`,
		`{"agent_id":"other"}`, `{"reason":"x"}`, `{"unknown":1}`, "\xff\xfe", `{"content":"\ud800"}`,
	} {
		for i := range routes {
			f.Add(uint8(i), body)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := routes[int(route)%len(routes)]
		req, err := http.NewRequest(r.method, base+r.path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", r.accept)
		resp, data := testenv.Do(t, req)
		if resp.StatusCode >= 500 {
			t.Fatalf("%s %s %q: %d %s", r.method, r.path, body, resp.StatusCode, data)
		}
		if resp.StatusCode >= 400 {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			var st rpcStatus
			if err := dec.Decode(&st); err != nil || st.Message == "" {
				t.Fatalf("%s %s %q: %d is not a google.rpc.Status: %s", r.method, r.path, body, resp.StatusCode, data)
			}
		}
	})
}

// FuzzA2ARequests: whatever body a client posts to an agent's A2A
// endpoint, in either protocol version, the gateway answers without a
// 5xx, in JSON-RPC: one response object, or a stream of them as
// Server-Sent Events. The agent is connected and echoes, so a body that
// decodes reaches it. One gateway serves every input.
func FuzzA2ARequests(f *testing.F) {
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	cfg := testConfig("gw-fuzz-a2a")
	cfg.ClientRate, cfg.ClientBurst, cfg.ClientStreams = 1e9, 1e9, 1e6
	withHistory(nil)(&cfg)
	conn, base := startWith(f, cfg, openStore(f), tel)
	ctx, cancel := context.WithCancel(context.Background())
	f.Cleanup(cancel)
	stream, err := covenpb.NewCovenControlClient(conn).AgentStream(ctx)
	if err != nil {
		f.Fatal(err)
	}
	if err := stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Register{Register: &covenpb.RegisterAgent{AgentId: "fuzz-1"}}}); err != nil {
		f.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		f.Fatalf("register: %v %v", m, err)
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if req := m.GetSendMessage(); req != nil {
				_ = stream.Send(&covenpb.AgentMessage{Payload: &covenpb.AgentMessage_Response{Response: &covenpb.MessageResponse{
					RequestId: req.RequestId, Event: &covenpb.MessageResponse_Done{Done: &covenpb.Done{FullResponse: req.Content}},
				}}})
			}
		}
	}()
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hi"}]}}}`,
		`{"jsonrpc":"2.0","id":"x","method":"SendStreamingMessage","params":{"message":{"messageId":"m2","role":"ROLE_USER","parts":[{"raw":"aGk=","filename":"f"},{"data":{"a":1}}]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"messageId":"m3","role":"user","kind":"message","parts":[{"kind":"text","text":"hi"}]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"message/stream","params":{"message":{"messageId":"m4","role":"user","parts":[{"kind":"file","file":{"bytes":"aGk=","name":"f"}}]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"gw-fuzz-a2a.00","historyLength":-1}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{"id":""}}`,
		`{"jsonrpc":"2.0","id":1,"method":"SubscribeToTask","params":{"id":"\u0000"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m5","contextId":"\ud800","parts":[{"url":"file:///etc/passwd"}]}}}`,
		`{"jsonrpc":"2.0","id":{},"method":"SendMessage"}`, `{"jsonrpc":"1.0"}`, `[]`, `null`, ``, `{`, "\xff",
		`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m6","parts":[null]}}}`,
	} {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := http.NewRequest(http.MethodPost, base+"/a2a/fuzz-1", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, data := testenv.Do(t, req)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%q: HTTP %d %s", body, resp.StatusCode, data)
		}
		var objects [][]byte
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			for _, line := range strings.Split(string(data), "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok {
					objects = append(objects, []byte(d))
				}
			}
		} else {
			objects = append(objects, data)
		}
		if len(objects) == 0 {
			t.Fatalf("%q: an empty answer", body)
		}
		for _, o := range objects {
			var r struct {
				JSONRPC string          `json:"jsonrpc"`
				Result  json.RawMessage `json:"result"`
				Error   *struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(o, &r); err != nil || r.JSONRPC != "2.0" || (r.Result == nil) == (r.Error == nil) ||
				(r.Error != nil && (r.Error.Code == 0 || r.Error.Message == "")) {
				t.Fatalf("%q: not a JSON-RPC response: %s", body, o)
			}
		}
	})
}
