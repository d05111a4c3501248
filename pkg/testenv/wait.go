package testenv

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// Eventually polls cond until it holds, and fails the test when timeout
// passes first, naming what it waited for. Every wait in a test has a
// deadline of its own, so that a hang fails the test that hung, with its
// reason, rather than the whole run at its timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyNoError(t, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// EventuallyNoError polls cond until it returns nil, and fails the test
// when timeout passes first, naming what it waited for and cond's last
// error.
func EventuallyNoError(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

var errNotYet = fmt.Errorf("not yet")

// Poll calls cond until it returns nil or timeout passes, starting at
// 10 ms between calls and backing off to 250 ms, and returns cond's last
// error (wrapped with the time waited) if it never returned nil. It is the
// wait under EventuallyNoError, for a caller with no test to fail (a
// TestMain) or one that adds what it only reads on failure.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	pause := 10 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("still not after %s: %w", timeout, err)
		}
		time.Sleep(min(pause, time.Until(deadline)))
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// AwaitRefused returns once addr refuses TCP connections: a server has
// closed its listeners (a drain is under way, or it stopped). There is no
// event to wait on from outside the server.
func AwaitRefused(t testing.TB, addr string) {
	t.Helper()
	Eventually(t, time.Minute, addr+" to refuse connections", func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return true
		}
		_ = c.Close()
		return false
	})
}
