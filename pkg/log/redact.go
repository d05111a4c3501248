package log

import (
	"log/slog"
	"slices"
	"strings"
	"unicode"
)

// Redacted replaces the value of every attribute whose key names a secret.
const Redacted = "[REDACTED]"

// Redact is a slog.HandlerOptions.ReplaceAttr function that hides the values
// of attributes whose key, or any enclosing group name, looks like it holds a
// credential: a word "token", "secret(s)", "password(s)", "passwd" or
// "authorization", or the words "api key", in any case and whether the key is
// snake_case, kebab-case or camelCase ("access_token", "X-Api-Key",
// "clientSecret", "Authorization").
//
// Keys are split into words rather than searched for substrings so that usage
// counters such as "input_tokens" or "max_tokens", which an LLM platform logs
// constantly, stay visible.
func Redact(groups []string, a slog.Attr) slog.Attr {
	if isSecretKey(a.Key) {
		return slog.String(a.Key, Redacted)
	}
	for _, g := range groups {
		if isSecretKey(g) {
			return slog.String(a.Key, Redacted)
		}
	}
	return a
}

// secretHints are substrings every secret key contains; checking them first
// keeps the common case (an ordinary key) free of allocations, because
// ReplaceAttr runs for every attribute of every record.
var secretHints = []string{"token", "secret", "passw", "authorization", "api"}

func isSecretKey(key string) bool {
	lower := strings.ToLower(key)
	if !slices.ContainsFunc(secretHints, func(h string) bool { return strings.Contains(lower, h) }) {
		return false
	}
	words := splitWords(key)
	for i, w := range words {
		switch w {
		case "token", "secret", "secrets", "password", "passwords", "passwd", "authorization", "apikey":
			return true
		case "api":
			if i+1 < len(words) && words[i+1] == "key" {
				return true
			}
		}
	}
	return false
}

// splitWords lower-cases key and splits it at non-alphanumeric runes and at
// lower-to-upper case transitions.
func splitWords(key string) []string {
	var (
		words []string
		cur   strings.Builder
		prev  rune
	)
	flush := func() {
		if cur.Len() > 0 {
			words = append(words, cur.String())
			cur.Reset()
		}
	}
	for _, r := range key {
		switch {
		case !unicode.IsLetter(r) && !unicode.IsDigit(r):
			flush()
		case unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			flush()
			cur.WriteRune(unicode.ToLower(r))
		default:
			cur.WriteRune(unicode.ToLower(r))
		}
		prev = r
	}
	flush()
	return words
}
