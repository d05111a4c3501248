package policy

import (
	"regexp"
	"strings"
	"testing"
)

// validAgentID must accept exactly what the counted form of its pattern
// matched.
func FuzzValidAgentID(f *testing.F) {
	counted := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	for _, s := range []string{"", "a", "claude-3", "a.b_c-d", ".a", "-a", "a@b", "a b", "é", "a\n", strings.Repeat("a", 64), strings.Repeat("a", 65)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := validAgentID(id), counted.MatchString(id); got != want {
			t.Fatalf("validAgentID(%q) = %v, the counted pattern says %v", id, got, want)
		}
	})
}
