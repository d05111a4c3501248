package service_test

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/telemetry/metricstest"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

const throttleToken = "runner-token-0123456789"

// getAs sends GET path with tok through client, and returns the status and
// Retry-After.
func (r *testRunner) getAs(t *testing.T, client *http.Client, path, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", r.Base+path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// checkThrottle sends wrong tokens from 127.0.0.1 until the runner
// throttles that address: then even the right token gets 429 with
// Retry-After from it, while another address is served. Two requests are
// refused so.
func checkThrottle(t *testing.T, r *testRunner) {
	t.Helper()
	const path = "/api/v1/agent-types"
	for i := range auth.ThrottleBurst {
		if code, _ := r.getAs(t, http.DefaultClient, path, "wrong-token-0123456789"); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	for _, tok := range []string{"wrong-token-0123456789", throttleToken} {
		if code, retry := r.getAs(t, http.DefaultClient, path, tok); code != http.StatusTooManyRequests || retry == "" {
			t.Errorf("token %.5s… from the throttled address: %d, Retry-After %q; want 429 with Retry-After", tok, code, retry)
		}
	}
	if code, _ := r.getAs(t, testenv.ClientFrom(testenv.OtherLoopback), path, throttleToken); code != http.StatusOK {
		t.Errorf("another address: %d, want 200", code)
	}
}

func TestThrottlesWrongTokens(t *testing.T) {
	t.Parallel()
	r := startRunner(t, map[string]string{"CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "false", "CONCLAVE_RUNNER_CLIENT_TOKENS": throttleToken,
		// No regrowth within the test, however loaded the machine.
		"CONCLAVE_RUNNER_AUTH_THROTTLE": strconv.Itoa(auth.ThrottleBurst) + "/1h"})
	checkThrottle(t, r)
	if v := metricstest.Scrape(t, r.Base+"/metrics").Value("conclave_runner_auth_throttled_total"); v != 2 {
		t.Errorf("conclave_runner_auth_throttled_total = %v, want 2", v)
	}
}
