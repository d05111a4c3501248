package service_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/bus/internal/broker"
)

// request sends GET url with header through client and returns the status
// and Retry-After.
func request(t *testing.T, client *http.Client, url string, h http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// steadyThrottle is the default burst of wrong tokens, with no regrowth
// within a test: on a loaded machine a second could pass between the
// requests and hand the address a token back.
var steadyThrottle = strconv.Itoa(auth.ThrottleBurst) + "/1h"

// throttledBus starts a bus with grants and sends it wrong tokens from
// 127.0.0.1 until it throttles that address: then even an admin's token
// gets 429 with Retry-After from it, on the upgrade and the dead-letter
// API, and a token in initialize is refused as rate limited, while another
// address is served. Three requests are refused so.
func throttledBus(t *testing.T) *testBus {
	t.Helper()
	bus := startBus(t, defaultConfig(t, map[string]string{"CONCLAVE_BUS_GRANTS": grants, "CONCLAVE_BUS_AUTH_THROTTLE": steadyThrottle}), busOption{})
	for i := range auth.ThrottleBurst {
		if code, _ := request(t, http.DefaultClient, bus.http+"/", bearer("wrong-token-0123456789")); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d at the upgrade: %d, want 401", i+1, code)
		}
	}
	for _, path := range []string{"/", "/v1/dead-letters"} {
		if code, retry := request(t, http.DefaultClient, bus.http+path, bearer("admin-token-0123456789")); code != http.StatusTooManyRequests || retry == "" {
			t.Errorf("the admin's token on %s from the throttled address: %d, Retry-After %q; want 429 with it", path, code, retry)
		}
	}
	w := dial(t, bus.url, nil)
	if code, msg := w.callError(1, "initialize", `{"clientId":"x","token":"admin-token-0123456789"}`); code != broker.CodeRateLimited {
		t.Errorf("a token in initialize from the throttled address: %d %s, want %d", code, msg, broker.CodeRateLimited)
	}
	if code, _ := request(t, testenv.ClientFrom(testenv.OtherLoopback), bus.http+"/v1/dead-letters", bearer("admin-token-0123456789")); code != http.StatusOK {
		t.Errorf("another address: %d, want 200", code)
	}
	return bus
}

func TestThrottlesWrongTokens(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	throttledBus(t)
}
