package supervisor

import (
	"testing"
	"time"
)

// TestNotWrittenRetry: a launch received before its write comes back soon
// at first, then less often, and one whose write never lands is given up
// ("gone") after instanceWriteGrace before the launch queue's 10 receives
// would dead-letter it.
func TestNotWrittenRetry(t *testing.T) {
	t.Parallel()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := notWrittenRetry(i + 1); got != w {
			t.Errorf("notWrittenRetry(%d) = %s, want %s", i+1, got, w)
		}
	}
	receives, at := 1, time.Duration(0)
	for at < instanceWriteGrace {
		at += notWrittenRetry(receives)
		receives++
	}
	// The launch queue's MaxReceiveCount (service.go).
	const maxReceives = 10
	if receives >= maxReceives {
		t.Errorf("a launch never written is received %d times before it is given up, the queue dead-letters at %d", receives, maxReceives)
	}
}
