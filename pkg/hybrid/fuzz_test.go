package hybrid

import (
	"strings"
	"testing"
)

// FuzzParams: any tool arguments are either rejected with a validation error
// or accepted, and accepted ones give an argument vector with every flag in
// the --flag or --flag=value form, never a panic.
func FuzzParams(f *testing.F) {
	for _, s := range []string{
		`{"repo_name":"a/b","issue_number":1,"dry_run":true,"sources":["npm"]}`,
		`{"repo_name":"$(id)","issue_number":"1"}`, `{"issue_number":1e3}`, `{"issue_number":-0}`,
		`[]`, `{"sources":[null]}`, `{"q":"\u0000"}`, `{"a":{"b":[{"c":"d"}]}}`, `{`, `{"repo_name":"--x=y"}`,
	} {
		f.Add([]byte(s))
	}
	flags := []Flag{{"issue_number", "--issue"}, {"repo_name", "--repo"}, {"dry_run", "--dry-run"}, {"q", "--q"}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		params, err := DecodeParams(raw)
		if err != nil {
			if KindOf(err) != KindValidation {
				t.Fatalf("DecodeParams error of kind %q: %v", KindOf(err), err)
			}
			return
		}
		if err := Validate(params, 100); err != nil {
			if KindOf(err) != KindValidation || !strings.HasPrefix(err.Error(), "Validation error: ") {
				t.Fatalf("Validate: %v", err)
			}
			return
		}
		argv, err := Argv(flags, params)
		if err != nil {
			if KindOf(err) != KindValidation {
				t.Fatalf("Argv: %v", err)
			}
			return
		}
		for _, a := range argv {
			name, _, _ := strings.Cut(a, "=")
			if name != "--issue" && name != "--repo" && name != "--dry-run" && name != "--q" {
				t.Fatalf("argument %q does not start with a configured flag", a)
			}
			if strings.ContainsRune(a, 0) {
				t.Fatalf("argument %q carries a NUL", a)
			}
		}
	})
}
