package storage_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/storage"
)

func TestOpenQueueEmbeddedCreatesItsDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "not", "yet")
	q, err := storage.OpenQueue(context.Background(), config.Storage{Backend: config.BackendEmbedded, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Ensure(context.Background(), queue.Definition{Name: "opened"}); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.OpenQueue(context.Background(), config.Storage{Backend: "carrier-pigeon"}); err == nil {
		t.Error("an unknown backend opened")
	}
}
