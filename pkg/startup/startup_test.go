package startup_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/startup"
	"github.com/conclave-ai/conclave/pkg/store"
)

func embedded(dir string) config.Storage {
	return config.Storage{Backend: config.BackendEmbedded, DataDir: dir}
}

func common() config.Common { return config.Common{LogLevel: "info", LogFormat: "json"} }

// TestOpen: the backends are open, the tables and queues exist, the logger
// names the deployable, and Close lets another process (here, another
// Open) have the files.
func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	var logs bytes.Buffer
	tests := []struct {
		name      string
		queue     bool
		wantQueue bool
	}{
		{"store and queue", true, true},
		{"store only", false, false},
	}
	for _, tt := range tests {
		b, err := startup.Open(ctx, startup.Options{Name: "widget", Common: common(), Storage: embedded(dir), Logs: &logs,
			Tables: []store.Table{{Name: "widgets"}}, Queue: tt.queue, Queues: queues(tt.queue)})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if _, err := b.Store.Put(ctx, "widgets", store.Item{Key: store.Key{PK: "a", SK: "b"}}); err != nil {
			t.Errorf("%s: the table was not made: %v", tt.name, err)
		}
		if (b.Queue != nil) != tt.wantQueue {
			t.Errorf("%s: queue %v, want one: %v", tt.name, b.Queue, tt.wantQueue)
		}
		if b.Queue != nil {
			if _, err := b.Queue.Send(ctx, "widget-events", queue.Outgoing{Body: []byte("x")}); err != nil {
				t.Errorf("%s: the queue was not made: %v", tt.name, err)
			}
		}
		b.Logger.Info("hello")
		if !strings.Contains(logs.String(), `"service":"widget"`) {
			t.Errorf("%s: the logger does not name the deployable: %s", tt.name, logs.String())
		}
		b.Close()
	}
}

func queues(on bool) []queue.Definition {
	if !on {
		return nil
	}
	return []queue.Definition{{Name: "widget-events"}}
}

func TestOpenRefusesQueuesWithoutAQueue(t *testing.T) {
	t.Parallel()
	_, err := startup.Open(context.Background(), startup.Options{Name: "widget", Common: common(), Storage: embedded(t.TempDir()),
		Logs: &bytes.Buffer{}, Queues: queues(true)})
	if err == nil {
		t.Fatal("queues were named without a queue, and Open did not say so")
	}
}
