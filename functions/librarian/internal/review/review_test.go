package review

import "testing"

// The pages are parsed on first use, not at Register: a template that
// does not parse, or a page that render names and the templates lack,
// must fail here rather than on a reviewer's first visit.
func TestPageSetParses(t *testing.T) {
	set := pageSet()
	for _, name := range []string{"head", "list", "show", "signin", "problem"} {
		if set.Lookup(name) == nil {
			t.Errorf("no page %q", name)
		}
	}
}
