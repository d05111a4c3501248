package broker

import (
	"fmt"
	"slices"
	"testing"

	"github.com/conclave-ai/conclave/services/bus/internal/topic"
)

// TestRouteOncePerSession checks that a publish reaches each matching
// session once, through its latest matching subscription, whether a few
// sessions match or more than route scans without a map.
func TestRouteOncePerSession(t *testing.T) {
	t.Parallel()
	for _, sessions := range []int{1, 2, 8, 9, 20} {
		t.Run(fmt.Sprint(sessions), func(t *testing.T) {
			t.Parallel()
			b := New(Options{Metrics: nopMetrics()})
			var subs []*subscription
			subscribe := func(s *Session, pattern string) {
				p, err := topic.Compile(pattern)
				if err != nil {
					t.Fatal(err)
				}
				sub := &subscription{pattern: p, policy: ContinueAll, session: s}
				b.addSubscription(sub)
				subs = append(subs, sub)
			}
			all := make([]*Session, sessions)
			for i := range all {
				s := b.NewSession(SessionAuth{Open: true})
				perms, err := compileGrant(OpenGrant, fmt.Sprint("c", i))
				if err != nil {
					t.Fatal(err)
				}
				s.perms = perms
				all[i] = s
				subscribe(s, "a:*")
				subscribe(s, "b:*") // not matching
			}
			// Every other session subscribes again, matching: its later
			// subscription is the one that counts.
			for i := 0; i < sessions; i += 2 {
				subscribe(all[i], "a:1")
			}
			var want []*subscription
			seen := map[*Session]bool{}
			for _, sub := range slices.Backward(subs) {
				if sub.pattern.Match("a:1") && !seen[sub.session] {
					seen[sub.session] = true
					want = append(want, sub)
				}
			}
			if got := b.route("a:1"); !slices.Equal(got, want) {
				t.Errorf("route = %d subscriptions, want %d (or in another order)", len(got), len(want))
			}
		})
	}
}
