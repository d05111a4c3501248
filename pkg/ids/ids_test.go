package ids_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/pkg/ids"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		kind    ids.Kind
		id      string
		problem string // "" when accepted
	}{
		{"uuid", ids.AgentID, "550e8400-e29b-41d4-a716-446655440000", ""},
		{"slash in an agent id", ids.AgentID, "team/a", ""},
		{"unicode letters", ids.AgentID, "agent-é-日本", ""},
		{"at the bound", ids.AgentID, strings.Repeat("a", ids.MaxBytes), ""},
		{"empty", ids.AgentID, "", "is required"},
		{"over the bound", ids.AgentID, strings.Repeat("a", 10000), "is 10000 bytes; at most 128 are allowed"},
		{"multibyte over the bound", ids.AgentID, strings.Repeat("é", 65), "is 130 bytes; at most 128 are allowed"},
		{"invalid UTF-8", ids.AgentID, "\xff\xfe", "must be valid UTF-8"},
		{"NUL", ids.AgentID, "a\x00b", "must not contain spaces, control or format characters"},
		{"newline", ids.RequestID, "a\nb", "must not contain spaces, control or format characters"},
		{"DEL", ids.ThreadID, "a\x7fb", "must not contain spaces, control or format characters"},
		{"C1 control", ids.AgentID, "a\u0085b", "must not contain spaces, control or format characters"},
		{"space", ids.AgentID, "a b", "must not contain spaces, control or format characters"},
		{"no-break space", ids.AgentID, "a\u00a0b", "must not contain spaces, control or format characters"},
		{"bidi override", ids.AgentID, "a\u202eb", "must not contain spaces, control or format characters"},
		{"zero-width space", ids.AgentID, "a\u200bb", "must not contain spaces, control or format characters"},
		{"replacement character", ids.AgentID, "a\ufffdb", "must not contain spaces, control or format characters"},
		{"slash in an instance id", ids.InstanceID, "a/b", `must not contain any of '/', '#'`},
		{"hash in a task id", ids.TaskID, "a#b", `must not contain any of '/', '#'`},
		{"slash in a dead-letter id", ids.DeadLetterID, "../x", `must not contain any of '/'`},
		{"dot-dot", ids.AgentID, "..", `must not be "." or ".."`},
		{"dot", ids.InstanceID, ".", `must not be "." or ".."`},
		{"dots within", ids.AgentID, "a..b", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.kind.Check(tt.id)
			if tt.problem == "" {
				if err != nil {
					t.Fatalf("Check refused it: %v", err)
				}
				return
			}
			e, ok := errors.AsType[*ids.Error](err)
			if !ok {
				t.Fatalf("Check = %v, want an *ids.Error", err)
			}
			if e.Field != tt.kind.Field || e.Problem != tt.problem {
				t.Errorf("Check = %q %q, want %q %q", e.Field, e.Problem, tt.kind.Field, tt.problem)
			}
			if want := tt.kind.Field + " " + tt.problem; err.Error() != want {
				t.Errorf("Error() = %q, want %q", err.Error(), want)
			}
		})
	}
}

func TestCheckOptional(t *testing.T) {
	if err := ids.ThreadID.CheckOptional(""); err != nil {
		t.Errorf("an absent id: %v", err)
	}
	if err := ids.ThreadID.CheckOptional("\xff"); err == nil {
		t.Error("an invalid id present was accepted")
	}
}

// problems are every message Check may give: none has room for the id.
var problems = regexp.MustCompile(`^\w+ (is required|is \d+ bytes; at most \d+ are allowed|must be valid UTF-8|must not contain spaces, control or format characters|must not contain any of ('.'(, )?)+|must not be "\." or "\.\.")$`)

// FuzzCheck: Check never panics, never echoes the id, and accepts only ids
// that are short, valid UTF-8 and free of the refused characters.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"a", "a/b", "\xff\xfe", "a\x00", strings.Repeat("x", 200), "日本"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		for _, k := range []ids.Kind{ids.AgentID, ids.InstanceID, ids.TaskID, ids.DeadLetterID} {
			err := k.Check(id)
			if err == nil {
				if id == "" || len(id) > k.MaxBytes || !utf8.ValidString(id) || strings.ContainsAny(id, k.Forbidden+"\x00\n\r\t ") {
					t.Fatalf("%s accepted %q", k.Field, id)
				}
				continue
			}
			if !problems.MatchString(err.Error()) {
				t.Fatalf("%s: %q is not one of the fixed messages (it may echo the id)", k.Field, err)
			}
		}
	})
}
