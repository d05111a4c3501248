package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
)

// busError is the bus's one HTTP error shape; decodeBusError refuses
// anything else.
type busError struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeBusError(t *testing.T, body []byte) busError {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var e busError
	if err := dec.Decode(&e); err != nil || e.Error.Message == "" {
		t.Fatalf("body is not the bus's error shape (%v): %.300s", err, body)
	}
	return e
}

func busHTTP(t *testing.T, method, url string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if method == http.MethodPost {
		// State-changing requests declare JSON (docs/security.md).
		req.Header.Set("Content-Type", "application/json")
	}
	return testenv.Do(t, req)
}

// TestDeadLetterAPIEdges: a dead-letter id its rule refuses is a 400
// naming it, never a store call; unknown paths and wrong methods are in
// the bus's JSON error shape, as every error is.
func TestDeadLetterAPIEdges(t *testing.T) {
	t.Parallel()
	b := startBus(t, defaultConfig(t, nil), busOption{})
	long := strings.Repeat("a", 10000)
	for _, tt := range []struct {
		name, method, path string
		status             int
		mention            string
		allow              string
	}{
		{"id not UTF-8", "GET", "/v1/dead-letters/%FF%FE", 400, "dead_letter_id", ""},
		{"over-long id", "GET", "/v1/dead-letters/" + long, 400, "dead_letter_id", ""},
		{"redriving an id not UTF-8", "POST", "/v1/dead-letters/%FF%FE/redrive", 400, "dead_letter_id", ""},
		{"redriving an over-long id", "POST", "/v1/dead-letters/" + long + "/redrive", 400, "dead_letter_id", ""},
		{"an id with a NUL", "GET", "/v1/dead-letters/a%00b", 400, "dead_letter_id", ""},
		{"an id with an escaped slash", "GET", "/v1/dead-letters/a%2Fb", 400, "dead_letter_id", ""},
		{"an unknown id", "GET", "/v1/dead-letters/20260101T000000.000000000Z-x", 404, "not found", ""},
		{"an unknown path", "GET", "/nope", 404, "not found", ""},
		{"a wrong method", "PUT", "/v1/dead-letters", 405, "GET, HEAD", "GET, HEAD"},
		{"a wrong method on the WebSocket", "POST", "/", 405, "GET, HEAD", "GET, HEAD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := busHTTP(t, tt.method, b.http+tt.path)
			e := decodeBusError(t, body)
			if resp.StatusCode != tt.status || e.Error.Code != tt.status || !strings.Contains(e.Error.Message, tt.mention) {
				t.Fatalf("%d %s, want %d mentioning %q", resp.StatusCode, body, tt.status, tt.mention)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow %q, want %q", got, tt.allow)
			}
			if strings.Contains(string(body), "aaaaaaaa") {
				t.Errorf("the id is echoed: %.200s", body)
			}
		})
	}
}

// failingDeadLetters fails every read of the dead-letter table, with an
// error naming the key, as DynamoDB's refusals do.
type failingDeadLetters struct{ store.Store }

func (s failingDeadLetters) Get(ctx context.Context, table string, key store.Key) (store.Item, error) {
	if strings.Contains(table, "dead") {
		return store.Item{}, errors.New("store: invalid request: key longer than DynamoDB allows: " + key.SK + " SECRET")
	}
	return s.Store.Get(ctx, table, key)
}

// TestDeadLetterStoreErrorIsLogged: a failing store is a 503 without the
// store's error or the id; the log has it.
func TestDeadLetterStoreErrorIsLogged(t *testing.T) {
	t.Parallel()
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	var logs testenv.LockedBuffer
	b := startBus(t, defaultConfig(t, nil), busOption{st: failingDeadLetters{st}, logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for _, tt := range []struct{ method, path string }{
		{"GET", "/v1/dead-letters/dl-1"},
		{"POST", "/v1/dead-letters/dl-1/redrive"},
	} {
		resp, body := busHTTP(t, tt.method, b.http+tt.path)
		e := decodeBusError(t, body)
		if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(e.Error.Message, "SECRET") || strings.Contains(e.Error.Message, "dl-1") {
			t.Fatalf("%s %s: %d %s", tt.method, tt.path, resp.StatusCode, body)
		}
	}
	if !strings.Contains(logs.String(), "SECRET") || !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the store's error is not logged:\n%s", logs.String())
	}
}
