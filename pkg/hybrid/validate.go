package hybrid

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// The limits of the hybrid protocol's validation rules.
const (
	MaxRepoNameLength = 200
	MinIssueNumber    = 1
	MaxIssueNumber    = 999_999_999
	// DefaultMaxParamLength is security.max_param_length's default.
	DefaultMaxParamLength = 10_000
)

// Validation rule names, as in Error.Rule and the bridge's metrics.
const (
	RuleRepoName     = "repo_name"
	RuleIssueNumber  = "issue_number"
	RuleSources      = "sources"
	RuleStringLength = "string_length"
	RuleParams       = "params"
)

// Rules lists every validation rule name.
var Rules = []string{RuleRepoName, RuleIssueNumber, RuleSources, RuleStringLength, RuleParams}

var repoNamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+/[a-zA-Z0-9_.-]+$`)

// AllowedSources are the values a "sources" parameter may contain.
var AllowedSources = []string{"github", "pypi", "npm", "reddit", "hackernews"}

// DecodeParams parses a tool's parameters: one JSON object, numbers kept
// exact (json.Number) so that issue_number 1e3 or 2.5 is judged as written.
func DecodeParams(raw []byte) (map[string]any, error) {
	if len(strings.TrimSpace(string(raw))) == 0 {
		return map[string]any{}, nil
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, validationError(RuleParams, fmt.Sprintf("parameters are not valid JSON: %v", err))
	}
	if dec.More() {
		return nil, validationError(RuleParams, "parameters must be a single JSON object, found more after it")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, validationError(RuleParams, fmt.Sprintf("parameters must be a JSON object, got %s", jsonType(v)))
	}
	return obj, nil
}

// Validate applies the hybrid protocol's rules to params: repo_name's format and length,
// issue_number's range, sources' allow-list, and every string's length
// (nested ones included) against maxParamLength characters. Keys are checked
// in sorted order so that the same input always reports the same error.
//
// Nothing is "sanitized": parameters never reach a shell (Run passes an
// argument vector), so shell metacharacters are inert and kept as written.
func Validate(params map[string]any, maxParamLength int) error {
	if maxParamLength <= 0 {
		maxParamLength = DefaultMaxParamLength
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := params[k]
		if utf8.RuneCountInString(k) > maxParamLength {
			return validationError(RuleStringLength, fmt.Sprintf("parameter name longer than %d characters", maxParamLength))
		}
		var err error
		switch k {
		case "repo_name":
			err = validateRepoName(v)
		case "issue_number":
			err = validateIssueNumber(v)
		case "sources":
			err = validateSources(v)
		}
		if err != nil {
			return err
		}
		if err := validateLengths(k, v, maxParamLength); err != nil {
			return err
		}
	}
	return nil
}

func validateRepoName(v any) error {
	s, ok := v.(string)
	if !ok {
		return validationError(RuleRepoName, fmt.Sprintf("Invalid repo_name format: must be a string \"owner/repo\", got %s", jsonType(v)))
	}
	if utf8.RuneCountInString(s) > MaxRepoNameLength {
		return validationError(RuleRepoName, fmt.Sprintf("Invalid repo_name format: longer than %d characters", MaxRepoNameLength))
	}
	if !repoNamePattern.MatchString(s) {
		return validationError(RuleRepoName, "Invalid repo_name format: must match "+repoNamePattern.String()+" (owner/repo)")
	}
	return nil
}

func validateIssueNumber(v any) error {
	bad := func(why string) error {
		return validationError(RuleIssueNumber, fmt.Sprintf("Invalid issue_number: %s; must be an integer from %d to %d", why, MinIssueNumber, MaxIssueNumber))
	}
	var n int64
	switch x := v.(type) {
	case json.Number:
		i, err := x.Int64()
		if err != nil {
			return bad(fmt.Sprintf("%s is not an integer", x))
		}
		n = i
	case float64: // parameters decoded without UseNumber
		if x != float64(int64(x)) {
			return bad(fmt.Sprintf("%g is not an integer", x))
		}
		n = int64(x)
	case int:
		n = int64(x)
	case int64:
		n = x
	default:
		return bad("got " + jsonType(v))
	}
	if n < MinIssueNumber || n > MaxIssueNumber {
		return bad(fmt.Sprintf("%d is out of range", n))
	}
	return nil
}

func validateSources(v any) error {
	items, ok := v.([]any)
	if !ok {
		return validationError(RuleSources, "Invalid sources: must be an array of strings, got "+jsonType(v))
	}
	for i, it := range items {
		s, ok := it.(string)
		if !ok || !slices.Contains(AllowedSources, s) {
			return validationError(RuleSources, fmt.Sprintf("Invalid sources: item %d is %s; allowed: %s", i, describe(it), strings.Join(AllowedSources, ", ")))
		}
	}
	return nil
}

func validateLengths(path string, v any, max int) error {
	switch x := v.(type) {
	case string:
		if n := utf8.RuneCountInString(x); n > max {
			return validationError(RuleStringLength, fmt.Sprintf("parameter %s is %d characters long; the limit (security.max_param_length) is %d", path, n, max))
		}
	case []any:
		for i, it := range x {
			if err := validateLengths(fmt.Sprintf("%s[%d]", path, i), it, max); err != nil {
				return err
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if utf8.RuneCountInString(k) > max {
				return validationError(RuleStringLength, fmt.Sprintf("a key in parameter %s is longer than %d characters", path, max))
			}
			if err := validateLengths(path+"."+k, x[k], max); err != nil {
				return err
			}
		}
	}
	return nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64, int, int64:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// describe names a value in an error without echoing a long input back.
func describe(v any) string {
	s, ok := v.(string)
	if !ok {
		return jsonType(v)
	}
	if utf8.RuneCountInString(s) > 40 {
		s = string([]rune(s)[:40]) + "..."
	}
	return fmt.Sprintf("%q", s)
}
