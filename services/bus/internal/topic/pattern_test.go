package topic

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, topic string
		want           bool
	}{
		{"inbound:chat-1", "inbound:chat-1", true},
		{"inbound:chat-1", "inbound:chat-10", false},
		// The bare-prefix form of the bub protocol's text is dropped
		// (docs/protocols.md).
		{"inbound:chat-", "inbound:chat-1", false},
		{"agent:abc", "agent:abcd", false},
		{"inbound:*", "inbound:chat-1", true},
		{"inbound:*", "inbound:", true},
		{"inbound:*", "outbound:chat-1", false},
		{"inbound:chat-*", "inbound:chat-2", true},
		{"inbound:chat-*", "inbound:chats", false},
		{"*", "anything:at:all", true},
		{"*:*", "a:b:c", true},
		{"tg:?", "tg:1", true},
		{"tg:?", "tg:12", false},
		{"tg:?", "tg:é", true},
		{"tg:[0-9]*", "tg:123", true},
		{"tg:[0-9]*", "tg:x123", false},
		{"tg:[!0-9]*", "tg:x123", true},
		{"tg:[]x]", "tg:]", true},
		{"tg:[", "tg:[", true},
		{"tg:[ab", "tg:[ab", true},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"*critical", "inbound:critical", true},
	}
	for _, tt := range tests {
		if got := Match(tt.pattern, tt.topic); got != tt.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tt.pattern, tt.topic, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", strings.Repeat("a", MaxLen+1), "a\x00b", "\xff", "a\nb"} {
		if err := Validate(bad); err == nil {
			t.Errorf("Validate(%q) = nil, want an error", bad)
		}
	}
	if err := Validate("inbound:*"); err != nil {
		t.Errorf("Validate(inbound:*) = %v", err)
	}
}

// reference translates a pattern to a regular expression the way Python's
// fnmatch.translate does, as an independent oracle for the fuzz test.
func reference(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`(?s)\A`)
	for i := 0; i < len(pattern); {
		r, w := utf8.DecodeRuneInString(pattern[i:])
		i += w
		switch r {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '[':
			j := i
			if j < len(pattern) && pattern[j] == '!' {
				j++
			}
			if j < len(pattern) && pattern[j] == ']' {
				j++
			}
			k := strings.IndexByte(pattern[j:], ']')
			if k < 0 {
				b.WriteString(`\[`)
				continue
			}
			class := pattern[i : j+k]
			i = j + k + 1
			neg := strings.HasPrefix(class, "!")
			class = strings.TrimPrefix(class, "!")
			b.WriteString("[")
			if neg {
				b.WriteString("^")
			}
			// Each member or range, escaped.
			for c := 0; c < len(class); {
				lo, w := utf8.DecodeRuneInString(class[c:])
				c += w
				if c+1 < len(class) && class[c] == '-' {
					hi, w2 := utf8.DecodeRuneInString(class[c+1:])
					c += 1 + w2
					if hi < lo {
						continue // an empty range matches nothing
					}
					b.WriteString(regexp.QuoteMeta(string(lo)) + "-" + regexp.QuoteMeta(string(hi)))
					continue
				}
				if lo == '\\' || lo == ']' || lo == '[' || lo == '^' || lo == '-' {
					b.WriteString(`\`)
				}
				b.WriteRune(lo)
			}
			b.WriteString("]")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString(`\z`)
	re, err := regexp.Compile(b.String())
	if err != nil {
		return nil
	}
	return re
}

func FuzzMatch(f *testing.F) {
	for _, seed := range [][2]string{
		{"inbound:*", "inbound:chat-1"}, {"tg:[0-9]*", "tg:12"}, {"a*b?c", "aXbYc"},
		{"[!a]", "b"}, {"[", "["}, {"*[]x]*", "q]q"}, {"agent:abc", "agent:abcd"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		if Validate(pattern) != nil || Validate(topic) != nil {
			if Match(pattern, topic) && Validate(pattern) != nil {
				t.Fatalf("invalid pattern %q matched", pattern)
			}
			return
		}
		re := reference(pattern)
		if re == nil || strings.Contains(pattern, "[]") || strings.Contains(pattern, "[!]") {
			// Classes the regexp oracle cannot express; still must not panic.
			Match(pattern, topic)
			return
		}
		if got, want := Match(pattern, topic), re.MatchString(topic); got != want {
			t.Fatalf("Match(%q, %q) = %v, oracle %v (%s)", pattern, topic, got, want, re)
		}
	})
}

func TestQuote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		topic string
		not   []string
	}{
		{"tg:123", []string{"tg:1234"}},
		{"tg:*", []string{"tg:1", "tg:"}},
		{"a?b", []string{"axb"}},
		{"x[ab]", []string{"xa", "xb"}},
		{"[*?[]", []string{"a", "[*?"}},
	} {
		q := Quote(tc.topic)
		if !Match(q, tc.topic) {
			t.Errorf("Quote(%q) = %q does not match the topic itself", tc.topic, q)
		}
		for _, other := range tc.not {
			if Match(q, other) {
				t.Errorf("Quote(%q) = %q matches %q", tc.topic, q, other)
			}
		}
	}
}
