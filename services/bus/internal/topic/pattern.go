// Package topic matches bus topics against subscription patterns.
//
// Patterns are fnmatch-style globs, case-sensitive, as the public bub
// implementation uses them (Python's fnmatchcase): a star matches any run
// of characters, including none and including ':'; '?' matches exactly one
// character; "[seq]" one character in seq (ranges such as a-z allowed);
// "[!seq]" one character not in seq.
//
// A '[' without a closing ']' is an ordinary character. A pattern without
// wildcards matches only an equal topic: the bare-prefix form of the
// protocol's text (where "agent:abc" would also receive "agent:abcd") is not
// supported, because it breaks isolation between agents (docs/protocols.md,
// "bub").
package topic

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLen bounds topics and patterns, in bytes. Matching is linear in the
// topic for each '*', so a bound keeps the worst case small.
const MaxLen = 256

// Validate reports why s cannot be a topic or pattern: empty, too long, not
// UTF-8, or holding control characters.
func Validate(s string) error {
	switch {
	case s == "":
		return errors.New("topic is empty")
	case len(s) > MaxLen:
		return fmt.Errorf("topic is %d bytes, over the limit of %d", len(s), MaxLen)
	case !utf8.ValidString(s):
		return errors.New("topic is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("topic holds the control character %U", r)
		}
	}
	return nil
}

// Pattern is a compiled subscription pattern.
type Pattern struct {
	src string
	// literal is true when src has no wildcard, so matching is equality.
	literal bool
}

// Compile validates and compiles a pattern.
func Compile(src string) (Pattern, error) {
	if err := Validate(src); err != nil {
		return Pattern{}, err
	}
	return Pattern{src: src, literal: !strings.ContainsAny(src, "*?[")}, nil
}

// String returns the pattern as written.
func (p Pattern) String() string { return p.src }

// IsLiteral reports whether the pattern matches exactly one topic.
func (p Pattern) IsLiteral() bool { return p.literal }

// Match reports whether topic matches the pattern.
func (p Pattern) Match(topic string) bool {
	if p.literal {
		return p.src == topic
	}
	return match(p.src, topic)
}

// Quote returns a pattern matching exactly the topic t, whatever
// wildcard characters it holds: each of '*', '?' and '[' becomes a
// one-character class ("[*]", "[?]", "[[]").
func Quote(t string) string {
	if !strings.ContainsAny(t, "*?[") {
		return t
	}
	var b strings.Builder
	for _, r := range t {
		switch r {
		case '*', '?', '[':
			b.WriteByte('[')
			b.WriteRune(r)
			b.WriteByte(']')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Match compiles pattern and matches topic against it; an invalid pattern
// matches nothing.
func Match(pattern, topic string) bool {
	p, err := Compile(pattern)
	return err == nil && p.Match(topic)
}

// match is the classic glob matcher with one backtracking point: the most
// recent '*'. That is enough, because a later '*' can absorb anything an
// earlier one would, so the worst case is O(len(pattern)*len(topic)).
func match(pattern, name string) bool {
	px, nx := 0, 0
	starPx, starNx := -1, -1
	for px < len(pattern) || nx < len(name) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starPx, starNx = px, nx
				px++
				continue
			case '?':
				if nx < len(name) {
					_, w := utf8.DecodeRuneInString(name[nx:])
					px++
					nx += w
					continue
				}
			case '[':
				if nx < len(name) {
					r, w := utf8.DecodeRuneInString(name[nx:])
					if ok, width, valid := matchClass(pattern[px:], r); valid {
						if ok {
							px += width
							nx += w
							continue
						}
						break
					}
				}
				// An unclosed '[' is literal.
				if nx < len(name) && name[nx] == '[' && !classCloses(pattern[px:]) {
					px++
					nx++
					continue
				}
			default:
				if nx < len(name) && name[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		if starPx >= 0 && starNx < len(name) {
			_, w := utf8.DecodeRuneInString(name[starNx:])
			starNx += w
			px, nx = starPx+1, starNx
			continue
		}
		return false
	}
	return true
}

// classCloses reports whether the class starting at p[0] == '[' has a
// closing ']', by fnmatch's rules: a ']' right after '[' or '[!' is a member.
func classCloses(p string) bool {
	i := 1
	if i < len(p) && p[i] == '!' {
		i++
	}
	if i < len(p) && p[i] == ']' {
		i++
	}
	return strings.IndexByte(p[i:], ']') >= 0
}

// matchClass matches r against the class at the start of p. valid is false
// when the class is not closed, and the '[' is then an ordinary character.
func matchClass(p string, r rune) (ok bool, width int, valid bool) {
	if !classCloses(p) {
		return false, 0, false
	}
	i := 1
	negate := false
	if i < len(p) && p[i] == '!' {
		negate = true
		i++
	}
	first := true
	for i < len(p) {
		if p[i] == ']' && !first {
			return ok != negate, i + 1, true
		}
		first = false
		lo, w := utf8.DecodeRuneInString(p[i:])
		i += w
		hi := lo
		if i+1 < len(p) && p[i] == '-' && p[i+1] != ']' {
			hi, w = utf8.DecodeRuneInString(p[i+1:])
			i += 1 + w
		}
		if lo <= r && r <= hi {
			ok = true
		}
	}
	return false, 0, false // unreachable: classCloses found the ']'
}
