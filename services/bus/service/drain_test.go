package service_test

import (
	"context"
	"errors"
	"testing"

	"github.com/coder/websocket"
)

// TestShutdownTellsClientsToGoAway: a bus that drains closes every client
// connection with 1001 and a reason, so that clients reconnect elsewhere,
// though no goroutine per connection waits for the drain.
func TestShutdownTellsClientsToGoAway(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts a bus")
	}
	t.Parallel()
	bus := startBus(t, defaultConfig(t, nil), busOption{})
	idle := bus.client(t, "idle", "")
	subscriber := bus.client(t, "subscriber", "")
	subscriber.subscribe(2, "drain:*", "")
	bus.stop()
	for _, w := range []*wire{idle, subscriber} {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		_, _, err := w.c.Read(ctx)
		cancel()
		if got := websocket.CloseStatus(err); got != websocket.StatusGoingAway {
			t.Errorf("after shutdown: %v (status %v), want going away", err, got)
		}
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Reason == "" {
			t.Error("the going-away close has no reason")
		}
	}
}
