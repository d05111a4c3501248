package broker

import (
	"slices"
	"testing"
)

func TestReplyPatterns(t *testing.T) {
	t.Parallel()
	rules, err := ParseReplyRules([]string{"tg:*=outbound:{topic_id}", "tg:*=audit:{topic}", "inbox=replies", "x:*=out:{topic_id}"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		topic string
		want  []string
	}{
		{"tg:42", []string{"outbound:42", "audit:tg:42"}},
		{"inbox", []string{"replies"}},
		{"x:a:b", []string{"out:a:b"}},
		// A wildcard in the agent's topic stays literal: the agent of
		// tg:* may reply on the topic outbound:*, not on every outbound
		// topic.
		{"tg:*", []string{"outbound:[*]", "audit:tg:[*]"}},
		// Another prefix's 42 is not chat 42: no rule matches it.
		{"inbound:42", []string{}},
		{"web:42", []string{}},
	}
	for _, tt := range tests {
		if got := ReplyPatterns(rules, tt.topic); !slices.Equal(got, tt.want) {
			t.Errorf("ReplyPatterns(%q) = %q, want %q", tt.topic, got, tt.want)
		}
	}
}

func TestParseReplyRulesRejects(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"outbound:{topic_id}", "=outbound:x", "tg:*=", "tg:\x01=x", "tg:*=out:\x01"} {
		if _, err := ParseReplyRules([]string{spec}); err == nil {
			t.Errorf("ParseReplyRules(%q) accepted it", spec)
		}
	}
}
