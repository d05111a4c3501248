package testenv

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// At returns the value at path in v, a document decoded from JSON into
// any, as a T: each step of path is a string (a member of an object) or
// an int (an element of an array). It fails the test, naming the path,
// when a step is missing or the value is not a T, where an unchecked
// v.(map[string]any)["acks"].([]any)[0] would panic and end the whole
// test binary.
func At[T any](t testing.TB, v any, path ...any) T {
	t.Helper()
	cur := v
	for i, step := range path {
		next, err := step1(cur, step)
		if err != nil {
			t.Fatalf("%s: %v in %s", jsonPath(path[:i+1]), err, clip(v))
			var zero T
			return zero
		}
		cur = next
	}
	x, ok := cur.(T)
	if !ok {
		t.Fatalf("%s: %T (%s), want a %T in %s", jsonPath(path), cur, clip(cur), *new(T), clip(v))
	}
	return x
}

func step1(cur, step any) (any, error) {
	switch s := step.(type) {
	case string:
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%T, not an object", cur)
		}
		next, ok := m[s]
		if !ok {
			return nil, fmt.Errorf("no member %q", s)
		}
		return next, nil
	case int:
		a, ok := cur.([]any)
		if !ok {
			return nil, fmt.Errorf("%T, not an array", cur)
		}
		if s < 0 || s >= len(a) {
			return nil, fmt.Errorf("no element %d of %d", s, len(a))
		}
		return a[s], nil
	default:
		return nil, fmt.Errorf("a path step is a string or an int, not %T", step)
	}
}

func jsonPath(path []any) string {
	var b strings.Builder
	b.WriteString("$")
	for _, step := range path {
		if s, ok := step.(string); ok {
			b.WriteString("." + s)
		} else {
			fmt.Fprintf(&b, "[%v]", step)
		}
	}
	return b.String()
}

// clip shows v, cut short, so that a failure names what was there
// without printing a whole document.
func clip(v any) string {
	s := fmt.Sprintf("%v", v)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// As returns x as a T, or fails the test saying what was expected and
// what came, where an unchecked x.(T) would panic and end the whole test
// binary. what names x in the failure. Call it from the test's goroutine.
func As[T any](t testing.TB, x any, what string) T {
	t.Helper()
	v, ok := x.(T)
	if !ok {
		t.Fatalf("%s: got %T (%s), want a %v", what, x, clip(x), reflect.TypeFor[T]())
	}
	return v
}
