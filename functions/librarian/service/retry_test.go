package service_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// A submission sent again with the same idempotency key (the protocol's
// timestamp, or an Idempotency-Key header) gets the request its first
// attempt stored: same id and decision, no second request, no second events.
func TestRetriedSubmissionIsNotDoubled(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mod    func(req map[string]any)
		header string
	}{
		{"timestamp", func(req map[string]any) { req["timestamp"] = "2026-11-23T09:00:00Z" }, ""},
		{"Idempotency-Key", func(map[string]any) {}, "a1b2c3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, nil)
			req := librarianApproval()
			tt.mod(req)
			send := func() *librarianv1.LibrarianResponse {
				t.Helper()
				body, _ := json.Marshal(req)
				hr, _ := http.NewRequest("POST", e.srv.URL+"/agent/request", bytes.NewReader(body))
				hr.Header.Set("Authorization", "Bearer "+claudeToken)
				hr.Header.Set("Content-Type", "application/json")
				if tt.header != "" {
					hr.Header.Set("Idempotency-Key", tt.header)
				}
				resp, err := http.DefaultClient.Do(hr)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var out librarianv1.LibrarianResponse
				var raw bytes.Buffer
				_, _ = raw.ReadFrom(resp.Body)
				if err := protojson.Unmarshal(raw.Bytes(), &out); err != nil || resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, raw.Bytes())
				}
				return &out
			}
			first, second := send(), send()
			if first.RequestId != second.RequestId || second.Status != "approved" || second.GetAssignedId() != first.GetAssignedId() {
				t.Fatalf("first %v, retry %v", first, second)
			}
			if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.submitted", "librarian.request.approved"}) {
				t.Fatalf("events %v", got)
			}
			// Without a key, a resubmission is a new request.
			plain := librarianApproval()
			a := e.do(t, "POST", "/agent/request", claudeToken, plain).response(t)
			b := e.do(t, "POST", "/agent/request", claudeToken, plain).response(t)
			if a.RequestId == b.RequestId {
				t.Fatalf("two submissions without a key share id %s", a.RequestId)
			}
		})
	}
}
