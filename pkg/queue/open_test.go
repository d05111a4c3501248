package queue_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
)

func TestOpenEmbeddedCreatesItsDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "not", "yet")
	q, err := queue.Open(context.Background(), config.Storage{Backend: config.BackendEmbedded, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Ensure(context.Background(), queue.Definition{Name: "opened"}); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.Open(context.Background(), config.Storage{Backend: "carrier-pigeon"}); err == nil {
		t.Error("an unknown backend opened")
	}
}
