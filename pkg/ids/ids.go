// Package ids holds the one rule for each kind of id that crosses
// Conclave's edges: an agent's registration and every API that takes the
// same kind of id check it with the same Kind, so an id one accepts is
// reachable through all the others.
//
// Every kind is non-empty, valid UTF-8, at most MaxBytes bytes, and free of
// control characters (NUL included), Unicode format characters (bidi
// overrides, zero-width characters), whitespace and U+FFFD (the mark of a
// lossy decoding upstream): such ids would corrupt log lines and store
// keys, or look like another id. No id is "." or "..", which a URL path
// cannot carry as one segment. A kind may refuse more characters (its
// Forbidden ones), for ids that become one segment of a store key.
//
// The bound, 128 bytes for every kind here, is far inside what any store
// key allows (DynamoDB: 2,048 bytes for a partition key, 1,024 for a sort
// key, with room for the prefixes the stores add), and a UUID needs 36.
//
// A refusal is an *Error naming the field and what is wrong, never echoing
// the id itself, which may be huge or unprintable.
package ids

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxBytes is every kind's length bound.
const MaxBytes = 128

// Kind is one kind of id: the field that carries it and its rule.
type Kind struct {
	// Field names the id as callers know it: "agent_id".
	Field string
	// MaxBytes bounds its length in bytes.
	MaxBytes int
	// Forbidden lists ASCII characters refused beyond the ones every id
	// refuses.
	Forbidden string
}

// The kinds of id. Names are the fields' own in the protocols and APIs.
var (
	// AgentID names an agent: a coven agent's RegisterAgent.agent_id, the
	// gateway's client API, the Librarian's registry, the bus's agent
	// ids. It may contain '/' (coven-gateway routes such ids), which REST
	// paths carry escaped as %2F.
	AgentID = Kind{Field: "agent_id", MaxBytes: MaxBytes}
	// InstanceID names a runner instance (an agent run), and a gateway's
	// agent connection. It is one segment of the runner's store keys.
	InstanceID = Kind{Field: "instance_id", MaxBytes: MaxBytes, Forbidden: "/#"}
	// TaskID names a runner task; the caller chooses it at launch. It is
	// one segment of the runner's store keys.
	TaskID = Kind{Field: "task_id", MaxBytes: MaxBytes, Forbidden: "/#"}
	// ThreadID names a conversation with an agent.
	ThreadID = Kind{Field: "thread_id", MaxBytes: MaxBytes}
	// RequestID names a request to an agent: the gateway's
	// "<server_id>.<random>", and a coven MessageResponse's request_id.
	RequestID = Kind{Field: "request_id", MaxBytes: MaxBytes}
	// LibrarianRequestID names a Librarian request; beyond this rule it
	// has the Librarian's own form ("req-" and 16 base32 characters).
	LibrarianRequestID = Kind{Field: "request_id", MaxBytes: MaxBytes}
	// DeadLetterID names a message in the bus's dead-letter table.
	DeadLetterID = Kind{Field: "dead_letter_id", MaxBytes: MaxBytes, Forbidden: "/"}
)

// Error is an id that its kind's rule refuses.
type Error struct {
	// Field is the kind's field.
	Field string
	// Problem says what is wrong, without the id: "must be valid UTF-8".
	Problem string
}

func (e *Error) Error() string { return e.Field + " " + e.Problem }

// Check returns nil for an id the rule accepts, else an *Error.
func (k Kind) Check(id string) error {
	switch {
	case id == "":
		return k.refuse("is required")
	case len(id) > k.MaxBytes:
		return k.refuse(fmt.Sprintf("is %d bytes; at most %d are allowed", len(id), k.MaxBytes))
	case !utf8.ValidString(id):
		return k.refuse("must be valid UTF-8")
	case strings.ContainsFunc(id, refused):
		return k.refuse("must not contain spaces, control or format characters")
	case k.Forbidden != "" && strings.ContainsAny(id, k.Forbidden):
		return k.refuse(fmt.Sprintf("must not contain any of %s", quoteEach(k.Forbidden)))
	case id == "." || id == "..":
		// As a segment of a URL path, escaping leaves them as they are,
		// and they would name another path.
		return k.refuse(`must not be "." or ".."`)
	}
	return nil
}

// CheckOptional is Check for an id that may be absent: "" passes.
func (k Kind) CheckOptional(id string) error {
	if id == "" {
		return nil
	}
	return k.Check(id)
}

func (k Kind) refuse(problem string) error { return &Error{Field: k.Field, Problem: problem} }

// refused are the characters no id may contain.
func refused(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || unicode.IsSpace(r) || r == utf8.RuneError
}

func quoteEach(chars string) string {
	q := make([]string, 0, len(chars))
	for _, c := range chars {
		q = append(q, fmt.Sprintf("%q", c))
	}
	return strings.Join(q, ", ")
}
