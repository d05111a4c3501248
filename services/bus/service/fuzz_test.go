package service_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// FuzzRESTBodies: whatever body reaches the bus's HTTP routes that take
// JSON (a replica's forwarded delivery and spawn event; the dead-letter
// API takes none), the bus answers without a 5xx, and every error is the
// bus's JSON error shape. One bus serves every input.
func FuzzRESTBodies(f *testing.F) {
	const peer = "peer-token-0123456789"
	b := startBus(f, withID(defaultConfig(f, map[string]string{"CONCLAVE_BUS_PEER_TOKEN": peer}), "bus-fuzz"), busOption{})
	routes := []string{"/internal/v1/deliver", "/internal/v1/spawn-events", "/v1/dead-letters/redrive"}
	for _, body := range []string{
		`{"message_id":"m1","topic":"t","payload":{"type":"x"},"publisher":"p"}`, `{"message_id":"m1","topic":"t","client_id":"c","attempt":3}`,
		`{"topic":"agent:x","payload":"not an object"}`, `{`, `[]`, `null`, `""`, ``, `{"topic":"\u0000"}`,
		`{"topic":"` + strings.Repeat("t", 5000) + `"}`, `{"attempt":-1}`, `{"unknown":1}`, "\xff\xfe", `{"topic":"\ud800"}`,
	} {
		for i := range routes {
			f.Add(uint8(i), body)
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		path := routes[int(route)%len(routes)]
		req, err := http.NewRequest("POST", b.http+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+peer)
		resp, data := testenv.Do(t, req)
		if resp.StatusCode >= 500 {
			t.Fatalf("POST %s %q: %d %s", path, body, resp.StatusCode, data)
		}
		if resp.StatusCode >= 400 {
			decodeBusError(t, data)
		}
	})
}
