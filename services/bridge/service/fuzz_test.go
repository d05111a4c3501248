package service_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// FuzzRESTBodies: the bridge takes JSON over HTTP only as MCP messages;
// whatever body reaches /mcp, the bridge answers without a 5xx, and every
// HTTP error is a JSON-RPC error response. One bridge serves every input.
func FuzzRESTBodies(f *testing.F) {
	b := startHTTP(f, nil)
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"f","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":1,"result":{}}`, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, `[]`, `{"jsonrpc":"1.0"}`,
		`{`, `null`, `""`, ``, `{"jsonrpc":"2.0","id":{},"method":5}`, "\xff\xfe", `{"jsonrpc":"2.0","id":1,"method":"\ud800"}`,
	} {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := http.NewRequest(http.MethodPost, b.url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, data := testenv.Do(t, req)
		if resp.StatusCode >= 500 {
			t.Fatalf("POST %q: %d %s", body, resp.StatusCode, data)
		}
		if resp.StatusCode >= 400 {
			var e struct {
				JSONRPC string `json:"jsonrpc"`
				Error   *struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(data, &e) != nil || e.JSONRPC != "2.0" || e.Error == nil || e.Error.Message == "" {
				t.Fatalf("POST %q: %d is not a JSON-RPC error response: %s", body, resp.StatusCode, data)
			}
		}
	})
}
