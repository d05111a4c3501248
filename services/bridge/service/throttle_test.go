package service_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bridge/service"
)

// mcpPost sends an MCP initialize to url with tok through client, and
// returns the status and Retry-After.
func mcpPost(t *testing.T, client *http.Client, url, tok string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// checkThrottle sends wrong tokens from 127.0.0.1 until the bridge
// throttles that address: then even the right token gets 429 with
// Retry-After from it, while another address is served. Two requests are
// refused so.
func checkThrottle(t *testing.T, b *httpBridge) {
	t.Helper()
	for i := range auth.ThrottleBurst {
		if code, _ := mcpPost(t, http.DefaultClient, b.url, "wrong-token-0123456789"); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	for _, tok := range []string{"wrong-token-0123456789", testToken} {
		if code, retry := mcpPost(t, http.DefaultClient, b.url, tok); code != http.StatusTooManyRequests || retry == "" {
			t.Errorf("token %.5s… from the throttled address: %d, Retry-After %q; want 429 with Retry-After", tok, code, retry)
		}
	}
	if code, _ := mcpPost(t, testenv.ClientFrom(testenv.OtherLoopback), b.url, testToken); code != http.StatusOK {
		t.Errorf("another address: %d, want 200", code)
	}
}

func TestThrottlesWrongTokens(t *testing.T) {
	t.Parallel()
	// No regrowth within the test, however loaded the machine.
	b := startHTTP(t, func(c *service.Config) {
		c.AuthThrottle = auth.ThrottleSetting{Burst: auth.ThrottleBurst, Every: time.Hour}
	})
	checkThrottle(t, b)
	if v := metricstest.Scrape(t, b.metrics).Value("conclave_bridge_auth_throttled_total"); v != 2 {
		t.Errorf("conclave_bridge_auth_throttled_total = %v, want 2", v)
	}
}
