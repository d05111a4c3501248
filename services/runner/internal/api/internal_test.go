package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/server"
	"github.com/conclave-ai/conclave/pkg/store"
	runnerv1 "github.com/conclave-ai/conclave/proto/conclave/runner/v1"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// brokenStore fails every read, as a store that cannot be reached does,
// with an error naming the key.
type brokenStore struct{ store.Store }

func (brokenStore) Get(_ context.Context, _ string, key store.Key) (store.Item, error) {
	return store.Item{}, errors.New("store: invalid request: key longer than DynamoDB allows: " + key.PK + " SECRET")
}

// TestStoreErrorsStayInside: a store error is Kandev's internal_error
// without the store's words or the id; the cause is kept for the log.
func TestStoreErrorsStayInside(t *testing.T) {
	st, err := store.OpenBolt(filepath.Join(t.TempDir(), "s.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	s := &Server{rec: records.New(brokenStore{st})}
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"status": func() error {
			_, err := s.GetAgentStatus(ctx, &runnerv1.GetAgentStatusRequest{InstanceId: "inst-1"})
			return err
		},
		"task": func() error {
			_, err := s.GetTask(ctx, &runnerv1.GetTaskRequest{TaskId: "task-1"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := call()
			body := errorBody(err)
			data, _ := json.Marshal(body)
			if body.HTTPStatus != http.StatusInternalServerError || body.Error != CodeInternal || strings.Contains(string(data), "SECRET") || strings.Contains(string(data), "-1") {
				t.Fatalf("the client would see %s", data)
			}
			if cause, ok := server.HiddenCause(err); !ok || !strings.Contains(cause.Error(), "SECRET") {
				t.Fatalf("the cause is not kept for the log: %v, %v", cause, ok)
			}
		})
	}
}
