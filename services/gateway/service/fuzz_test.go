package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/telemetry"
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
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
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
