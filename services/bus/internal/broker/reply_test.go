package broker

import (
	"slices"
	"testing"
)

func TestReplyPatterns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		topic     string
		templates []string
		want      []string
	}{
		{"tg:42", []string{"outbound:{topic_id}"}, []string{"outbound:42"}},
		{"tg:42", []string{"audit:{topic}", "replies"}, []string{"audit:tg:42", "replies"}},
		{"inbox", []string{"outbound:{topic_id}"}, []string{"outbound:inbox"}},
		{"tg:a:b", []string{"out:{topic_id}"}, []string{"out:a:b"}},
		// A wildcard in the agent's topic stays literal: the agent of
		// tg:* may reply on outbound:* the topic, not on every outbound topic.
		{"tg:*", []string{"outbound:{topic_id}"}, []string{"outbound:[*]"}},
		{"tg:42", nil, []string{}},
	}
	for _, tt := range tests {
		if got := ReplyPatterns(tt.templates, tt.topic); !slices.Equal(got, tt.want) {
			t.Errorf("ReplyPatterns(%q, %q) = %q, want %q", tt.templates, tt.topic, got, tt.want)
		}
	}
}
