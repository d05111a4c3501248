package access

import (
	"regexp"
	"strings"
	"testing"
)

// The counted forms the patterns had: parseToken and ValidSubject must
// accept exactly what they matched.
var (
	countedToken   = regexp.MustCompile(`^lib_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$`)
	countedSubject = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)
)

var patternSeeds = []string{
	"", "lib_", "lib__", "lib_0123456789abcdef_" + strings.Repeat("A", 43), "lib_0123456789abcdef_" + strings.Repeat("_", 43),
	"lib_0123456789abcdef_" + strings.Repeat("A", 42), "lib_0123456789abcdef_" + strings.Repeat("A", 44),
	"lib_0123456789abcde_" + strings.Repeat("A", 44), "lib_0123456789ABCDEF_" + strings.Repeat("A", 43),
	"lib_0123456789abcdef_" + strings.Repeat("A", 43) + "\n", "a", "claude-3", "alice@example.com", ".x", "-x", "x y",
	strings.Repeat("a", 64), strings.Repeat("a", 65), "é", "a\n",
}

func FuzzParseToken(f *testing.F) {
	for _, s := range patternSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		id, secret, ok := parseToken(token)
		m := countedToken.FindStringSubmatch(token)
		if ok != (m != nil) {
			t.Fatalf("parseToken(%q) ok=%v, the counted pattern matched=%v", token, ok, m != nil)
		}
		if ok && (id != m[1] || secret != m[2]) {
			t.Fatalf("parseToken(%q) = %q, %q; want %q, %q", token, id, secret, m[1], m[2])
		}
	})
}

func FuzzValidSubject(f *testing.F) {
	for _, s := range patternSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidSubject(s), countedSubject.MatchString(s); got != want {
			t.Fatalf("ValidSubject(%q) = %v, the counted pattern says %v", s, got, want)
		}
	})
}
