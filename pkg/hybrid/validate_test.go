package hybrid

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 10_001)
	tests := []struct {
		name   string
		params string
		rule   string // "" means valid
		msg    string
	}{
		{"valid full", `{"repo_name":"facebook/react","issue_number":123,"dry_run":true,"sources":["github","npm"]}`, "", ""},
		{"empty", `{}`, "", ""},
		{"repo dots and dashes", `{"repo_name":"a-b_c/d.e-f_g"}`, "", ""},
		{"repo without owner", `{"repo_name":"react"}`, RuleRepoName, "Invalid repo_name format"},
		{"repo with shell", `{"repo_name":"a/b; rm -rf /"}`, RuleRepoName, "Invalid repo_name format"},
		{"repo with two slashes", `{"repo_name":"a/b/c"}`, RuleRepoName, "Invalid repo_name format"},
		{"repo not a string", `{"repo_name":5}`, RuleRepoName, "got a number"},
		{"repo too long", `{"repo_name":"a/` + strings.Repeat("b", 199) + `"}`, RuleRepoName, "longer than 200"},
		{"repo at 200", `{"repo_name":"a/` + strings.Repeat("b", 198) + `"}`, "", ""},
		{"issue zero", `{"issue_number":0}`, RuleIssueNumber, "out of range"},
		{"issue max", `{"issue_number":999999999}`, "", ""},
		{"issue above max", `{"issue_number":1000000000}`, RuleIssueNumber, "out of range"},
		{"issue negative", `{"issue_number":-4}`, RuleIssueNumber, "out of range"},
		{"issue fraction", `{"issue_number":2.5}`, RuleIssueNumber, "not an integer"},
		{"issue string", `{"issue_number":"12"}`, RuleIssueNumber, "got a string"},
		{"sources not array", `{"sources":"github"}`, RuleSources, "must be an array"},
		{"sources unknown", `{"sources":["github","gitlab"]}`, RuleSources, `item 1 is "gitlab"`},
		{"sources non-string", `{"sources":[1]}`, RuleSources, "item 0 is a number"},
		{"long string", `{"query":"` + long + `"}`, RuleStringLength, "parameter query is 10001 characters long"},
		{"long nested string", `{"opts":{"a":["` + long + `"]}}`, RuleStringLength, "parameter opts.a[0]"},
		{"multibyte counts characters", `{"q":"` + strings.Repeat("é", 10_000) + `"}`, "", ""},
		{"metacharacters are fine", `{"query":"$(touch /tmp/x); ` + "`id`" + ` | && > <"}`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			params, err := DecodeParams([]byte(tt.params))
			if err != nil {
				t.Fatal(err)
			}
			err = Validate(params, 0)
			if tt.rule == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			e, ok := err.(*Error)
			if !ok {
				t.Fatalf("Validate = %v, want a validation *Error", err)
			}
			if e.Kind != KindValidation || e.Rule != tt.rule || !strings.Contains(e.Error(), tt.msg) || !strings.HasPrefix(e.Error(), "Validation error: ") {
				t.Fatalf("Validate = %+v (%q), want rule %s containing %q", e, e.Error(), tt.rule, tt.msg)
			}
		})
	}
}

func TestValidateCustomLimit(t *testing.T) {
	t.Parallel()
	if err := Validate(map[string]any{"q": "abcdef"}, 5); KindOf(err) != KindValidation {
		t.Fatalf("6 characters with limit 5: %v", err)
	}
	if err := Validate(map[string]any{"q": "abcde"}, 5); err != nil {
		t.Fatalf("5 characters with limit 5: %v", err)
	}
}

func TestDecodeParams(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{`[1]`, "must be a JSON object, got an array"},
		{`"x"`, "must be a JSON object, got a string"},
		{`{"a":`, "not valid JSON"},
		{`{} {}`, "single JSON object"},
	} {
		_, err := DecodeParams([]byte(tt.in))
		if KindOf(err) != KindValidation || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("DecodeParams(%s) = %v, want %q", tt.in, err, tt.want)
		}
	}
	p, err := DecodeParams([]byte("  "))
	if err != nil || len(p) != 0 {
		t.Fatalf("blank parameters: %v %v", p, err)
	}
	p, err = DecodeParams([]byte(`{"n":12345678901234567890}`))
	if n, ok := p["n"].(json.Number); err != nil || !ok || n.String() != "12345678901234567890" {
		t.Fatalf("numbers must stay exact: %v %v", p, err)
	}
}

func TestArgv(t *testing.T) {
	t.Parallel()
	flags := []Flag{{"issue_number", "--issue"}, {"repo_name", "--repo"}, {"dry_run", "--dry-run"}}
	tests := []struct {
		params string
		want   []string
		err    string
	}{
		{`{"repo_name":"o/r","issue_number":123,"dry_run":true}`, []string{"--issue=123", "--repo=o/r", "--dry-run"}, ""},
		{`{"repo_name":"o/r","dry_run":false}`, []string{"--repo=o/r"}, ""},
		{`{"repo_name":null}`, nil, ""},
		{`{"repo_name":"--dry-run"}`, []string{"--repo=--dry-run"}, ""},
		{`{"repo_name":"a; rm -rf / $(id)"}`, []string{"--repo=a; rm -rf / $(id)"}, ""},
		{`{"repo_name":["a"]}`, nil, "must be a string, number or boolean, got an array"},
		{`{"repo_name":"a\u0000b"}`, nil, "NUL"},
	}
	for _, tt := range tests {
		params, err := DecodeParams([]byte(tt.params))
		if err != nil {
			t.Fatal(err)
		}
		got, err := Argv(flags, params)
		if tt.err != "" {
			if KindOf(err) != KindValidation || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Argv(%s) error = %v, want %q", tt.params, err, tt.err)
			}
			continue
		}
		if err != nil || strings.Join(got, "\x00") != strings.Join(tt.want, "\x00") {
			t.Errorf("Argv(%s) = %q, %v; want %q", tt.params, got, err, tt.want)
		}
	}
}

func TestSortedFlags(t *testing.T) {
	t.Parallel()
	got := SortedFlags(map[string]string{"repo_name": "--repo", "dry_run": "--dry-run", "issue_number": "--issue"})
	want := []Flag{{"dry_run", "--dry-run"}, {"issue_number", "--issue"}, {"repo_name", "--repo"}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("SortedFlags = %v, want %v", got, want)
		}
	}
}
