package executor

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Every instance id and launch makes a valid Job name, and every id a valid
// label value; ids valid as they are stay readable.
func FuzzKubeNames(f *testing.F) {
	for _, id := range []string{
		"", "a", "0f8fad5b-d9cb-469f-a165-70867728950e", "UPPER", "with space", "-leading", "trailing-",
		"dots.and_underscores", strings.Repeat("x", 63), strings.Repeat("x", 64), strings.Repeat("é", 40),
		"task:123/456", "\x00\xff", "a--b",
	} {
		f.Add(id, int64(1))
	}
	f.Add("x", int64(-9223372036854775808))
	f.Add(strings.Repeat("y", 100), int64(9223372036854775807))
	f.Fuzz(func(t *testing.T, id string, launch int64) {
		name := jobName(id, launch)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("jobName(%q, %d) = %q: %v", id, launch, name, errs)
		}
		if jobName(id, launch) != name {
			t.Errorf("jobName(%q, %d) is not deterministic", id, launch)
		}
		if jobName(id, launch+1) == name && launch+1 > launch {
			t.Errorf("launches %d and %d of %q share the name %q", launch, launch+1, id, name)
		}
		value := labelValue(id)
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			t.Errorf("labelValue(%q) = %q: %v", id, value, errs)
		}
		if len(validation.IsValidLabelValue(id)) == 0 && value != id {
			t.Errorf("labelValue(%q) = %q, want the valid id itself", id, value)
		}
	})
}
