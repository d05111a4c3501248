package testenv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name    string
		timeout time.Duration
		// okAfter is the call from which cond succeeds (0: never).
		okAfter int
		wantErr error
	}{
		{"at once", time.Minute, 1, nil},
		{"after a few tries", time.Minute, 4, nil},
		{"never", 30 * time.Millisecond, 0, boom},
		{"no time at all still tries once", 0, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := Poll(tt.timeout, func() error {
				calls++
				if tt.okAfter != 0 && calls >= tt.okAfter {
					return nil
				}
				return boom
			})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("poll: %v, want %v", err, tt.wantErr)
			}
			if tt.okAfter != 0 && calls != tt.okAfter {
				t.Errorf("cond called %d times, want %d", calls, tt.okAfter)
			}
		})
	}
}

// recorder is a testing.TB that records Fatalf instead of ending the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

func TestEventuallyNamesWhatItWaitedFor(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	Eventually(r, 20*time.Millisecond, "the moon", func() bool { return false })
	if !strings.Contains(r.failed, "the moon") {
		t.Fatalf("Eventually's failure on a condition that never held: %q, want it to name the moon", r.failed)
	}
	r = &recorder{TB: t}
	Eventually(r, time.Minute, "the sun", func() bool { return true })
	if r.failed != "" {
		t.Fatal("Eventually failed on a condition that held")
	}
}
