package service_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	gatewayv1 "github.com/conclave-ai/conclave/proto/conclave/gateway/v1"
	"github.com/conclave-ai/conclave/services/gateway/service"
)

// rpcStatus is google.rpc.Status as JSON, the gateway's one REST error
// shape; decodeStatus refuses anything else.
type rpcStatus struct {
	Code    int               `json:"code"`
	Message string            `json:"message"`
	Details []json.RawMessage `json:"details"`
}

func decodeStatus(t *testing.T, body []byte) rpcStatus {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var st rpcStatus
	if err := dec.Decode(&st); err != nil || st.Message == "" {
		t.Fatalf("body is not a google.rpc.Status (%v): %s", err, body)
	}
	return st
}

func restCall(t *testing.T, method, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if method == http.MethodPost {
		// State-changing requests declare JSON (docs/security.md); a
		// header given below overrides it.
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return testenv.Do(t, req)
}

// TestRESTRefusesBadIDs: an id its rule refuses is a 400 naming the field,
// in the REST error shape, before marshalling or the store; the id is not
// echoed.
func TestRESTRefusesBadIDs(t *testing.T) {
	t.Parallel()
	_, base := startGateway(t)
	long := strings.Repeat("a", 10000)
	tests := []struct {
		name, method, path, body, accept, field string
	}{
		{"invalid UTF-8 agent", "GET", "/v1/agents/%FF%FE", "", "", "agent_id"},
		{"over-long agent", "GET", "/v1/agents/" + long, "", "", "agent_id"},
		{"agent with NUL", "GET", "/v1/agents/a%00b", "", "", "agent_id"},
		{"invalid UTF-8 agent, NDJSON", "POST", "/v1/agents/%FF%FE/messages", `{"content":"x"}`, "", "agent_id"},
		{"invalid UTF-8 agent, SSE", "POST", "/v1/agents/%FF%FE/messages", `{"content":"x"}`, "text/event-stream", "agent_id"},
		{"over-long agent, SSE", "POST", "/v1/agents/" + long + "/messages", `{"content":"x"}`, "text/event-stream", "agent_id"},
		{"thread with a newline", "POST", "/v1/agents/a/messages", `{"content":"x","thread_id":"a\nb"}`, "", "thread_id"},
		{"invalid UTF-8 request", "POST", "/v1/requests/%FF/cancel", `{}`, "", "request_id"},
		{"over-long request", "POST", "/v1/requests/" + long + "/cancel", `{}`, "", "request_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := restCall(t, tt.method, base+tt.path, tt.body, "Accept", tt.accept)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", resp.StatusCode, b)
			}
			st := decodeStatus(t, b)
			if codes.Code(st.Code) != codes.InvalidArgument || !strings.HasPrefix(st.Message, tt.field+" ") {
				t.Errorf("status %+v, want INVALID_ARGUMENT naming %s", st, tt.field)
			}
			if strings.Contains(string(b), "aaaaaaaa") {
				t.Errorf("the id is echoed: %.200s", b)
			}
		})
	}
	t.Run("gRPC", func(t *testing.T) {
		conn, _ := startGateway(t)
		_, err := gatewayv1.NewGatewayServiceClient(conn).GetAgent(authed(t.Context()), &gatewayv1.GetAgentRequest{AgentId: long})
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "agent_id ") {
			t.Fatalf("GetAgent with a 10,000-byte id: %v", err)
		}
	})
}

// TestRESTReachesAgentWithSlash: an agent that registers with '/' in its
// agent_id is reached through REST with the '/' escaped.
func TestRESTReachesAgentWithSlash(t *testing.T) {
	t.Parallel()
	conn, base := startGateway(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echoAgent(t, ctx, conn, "team/a")

	resp, b := restCall(t, "GET", base+"/v1/agents/team%2Fa", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"agent_id":"team/a"`) {
		t.Fatalf("GET /v1/agents/team%%2Fa: %d %s", resp.StatusCode, b)
	}
	for _, accept := range []string{"application/json", "text/event-stream"} {
		resp, b = restCall(t, "POST", base+"/v1/agents/team%2Fa/messages", `{"content":"hi"}`, "Accept", accept)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "echo: hi") {
			t.Fatalf("POST /v1/agents/team%%2Fa/messages (%s): %d %s", accept, resp.StatusCode, b)
		}
	}
}

// TestRESTErrorShape: every error of the gateway's HTTP port, the
// server's own (unknown path, wrong method, body over the limit) and
// grpc-gateway's, is a google.rpc.Status.
func TestRESTErrorShape(t *testing.T) {
	t.Parallel()
	_, base := startGateway(t)
	big := `{"content":"` + strings.Repeat("x", 6<<20) + `"}`
	tests := []struct {
		name, method, path, body string
		want                     int
		code                     codes.Code
		allow                    string
	}{
		{"unknown path", "GET", "/nope", "", http.StatusNotFound, codes.NotFound, ""},
		{"unknown path under /v1", "GET", "/v1/nope", "", http.StatusNotFound, codes.NotFound, ""},
		{"PUT on the list", "PUT", "/v1/agents", "{}", http.StatusMethodNotAllowed, codes.Unimplemented, "GET, HEAD"},
		{"DELETE on an agent", "DELETE", "/v1/agents/x", "", http.StatusMethodNotAllowed, codes.Unimplemented, "GET, HEAD"},
		{"GET on messages", "GET", "/v1/agents/x/messages", "", http.StatusMethodNotAllowed, codes.Unimplemented, "POST"},
		{"body over the limit", "POST", "/v1/agents/x/messages", big, http.StatusRequestEntityTooLarge, codes.ResourceExhausted, ""},
		{"malformed body", "POST", "/v1/requests/r.1/cancel", `{"reason":`, http.StatusBadRequest, codes.InvalidArgument, ""},
		{"unknown agent", "GET", "/v1/agents/ghost", "", http.StatusNotFound, codes.NotFound, ""},
		{"HEAD of an unknown agent", "HEAD", "/v1/agents/ghost", "", http.StatusNotFound, codes.NotFound, ""},
		{"unknown agent, stream", "POST", "/v1/agents/ghost/messages", `{"content":"x"}`, http.StatusNotFound, codes.NotFound, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := restCall(t, tt.method, base+tt.path, tt.body)
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tt.want, b)
			}
			if tt.method == "HEAD" {
				// No body; the status says it.
			} else if st := decodeStatus(t, b); codes.Code(st.Code) != tt.code {
				t.Errorf("code %v, want %v: %s", codes.Code(st.Code), tt.code, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
		})
	}
}

// failingStore fails every read of the agent "fail-me", as a store that
// cannot be reached does, with an error naming the key.
type failingStore struct{ store.Store }

var errStoreDown = errors.New("store: invalid request: key longer than DynamoDB allows: agent#fail-me SECRET")

func (s failingStore) Get(ctx context.Context, table string, key store.Key) (store.Item, error) {
	if strings.Contains(key.PK+key.SK, "fail-me") {
		return store.Item{}, errStoreDown
	}
	return s.Store.Get(ctx, table, key)
}

// TestStoreErrorIsLoggedNotSent: a failing store is a 503 that tells the
// client to retry, without the store's error or the id; the log has both.
func TestStoreErrorIsLoggedNotSent(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.New(context.Background(), telemetry.Config{ServiceName: "gateway-test"})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.LockedBuffer
	gw, err := service.New(testConfig("gw-fail"), service.Deps{Store: failingStore{openStore(t)}, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-gw.Ready()
	base := ""
	for _, e := range gw.Endpoints() {
		if strings.HasPrefix(e.Protocol, "HTTP") {
			base = "http://" + e.Address
		}
	}
	resp, b := restCall(t, "GET", base+"/v1/agents/fail-me", "")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, b)
	}
	st := decodeStatus(t, b)
	if codes.Code(st.Code) != codes.Unavailable || strings.Contains(st.Message, "fail-me") || strings.Contains(st.Message, "DynamoDB") {
		t.Errorf("the client sees internals: %s", b)
	}
	if !strings.Contains(logs.String(), "SECRET") || !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the store's error is not logged at error level:\n%s", logs.String())
	}
}

// TestSilentAgentStreamStartsAtOnce: a streaming request to an agent that
// says nothing gets its headers and a first response with the request_id
// at once, REST and SSE alike, and can be cancelled with it.
func TestSilentAgentStreamStartsAtOnce(t *testing.T) {
	t.Parallel()
	conn, base := startGateway(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	registerAgent(t, ctx, conn, "silent")
	for _, tt := range []struct{ accept, prefix string }{
		{"application/json", ""},
		{"text/event-stream", "data: "},
	} {
		t.Run(tt.accept, func(t *testing.T) {
			wait, stop := context.WithTimeout(ctx, 30*time.Second)
			defer stop()
			req, _ := http.NewRequestWithContext(wait, "POST", base+"/v1/agents/silent/messages", strings.NewReader(`{"content":"anyone?"}`))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", tt.accept)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("waiting for the stream's headers before the agent answers: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			sc := bufio.NewScanner(resp.Body)
			var first string
			for first == "" && sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), tt.prefix); ok {
					first = line
				}
			}
			if first == "" {
				t.Fatalf("waiting for the first response before the agent answers: %v", sc.Err())
			}
			var m struct {
				RequestID string          `json:"request_id"`
				Event     json.RawMessage `json:"event"`
			}
			_ = json.Unmarshal([]byte(first), &m)
			if m.RequestID == "" || string(m.Event) != "null" {
				t.Fatalf("first response %s, want only a request_id", first)
			}
			resp2, b := restCall(t, "POST", base+"/v1/requests/"+m.RequestID+"/cancel", `{"reason":"no answer"}`)
			if resp2.StatusCode != http.StatusOK || !strings.Contains(string(b), `"cancelled":true`) {
				t.Fatalf("cancel %s: %d %s", m.RequestID, resp2.StatusCode, b)
			}
		})
	}
}
