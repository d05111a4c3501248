package hybrid

import (
	"encoding/json"
	"errors"
)

// Kind is a bridge-side failure class of the hybrid protocol. The set is
// fixed, so it is safe as a metric label.
type Kind string

// The bridge-side error kinds. Agent-side errors (an agent answering
// {"status":"error"} with exit code 0) are not Errors: they are a Response.
const (
	// KindValidation: a parameter failed validation before execution.
	KindValidation Kind = "validation"
	// KindNotFound: the script or the interpreter is missing or not usable.
	KindNotFound Kind = "agent_not_found"
	// KindTimeout: the agent exceeded its timeout; its process group was killed.
	KindTimeout Kind = "timeout"
	// KindInvalidJSON: stdout was empty, not JSON, or not a protocol response.
	KindInvalidJSON Kind = "invalid_json"
	// KindExecution: the agent exited with a non-zero code (or was killed by
	// a signal).
	KindExecution Kind = "execution"
	// KindOutputTooLarge: stdout exceeded the limit and was cut off.
	KindOutputTooLarge Kind = "output_too_large"
	// KindCancelled: the caller went away before the agent finished.
	KindCancelled Kind = "cancelled"
	// KindBusy: the caller's limit of agents running at once was reached;
	// nothing was started.
	KindBusy Kind = "busy"
	// KindNotApproved: the tool is governed and the Librarian did not
	// approve the call (rejected, sent back, timed out, or could not be
	// asked: failing closed); the agent was not run.
	KindNotApproved Kind = "not_approved"
)

// Kinds lists every Kind, for documentation and metrics tests.
var Kinds = []Kind{KindValidation, KindNotFound, KindTimeout, KindInvalidJSON, KindExecution, KindOutputTooLarge, KindCancelled, KindBusy, KindNotApproved}

var prefixes = map[Kind]string{
	KindValidation:     "Validation error",
	KindNotFound:       "Agent not found",
	KindTimeout:        "Timeout",
	KindInvalidJSON:    "Invalid JSON",
	KindExecution:      "Execution error",
	KindOutputTooLarge: "Output too large",
	KindCancelled:      "Cancelled",
	KindBusy:           "Busy",
	KindNotApproved:    "Not approved",
}

// Error is a bridge-side failure. Its message is the ADK bridge's error string,
// e.g. "Validation error: Invalid repo_name format".
type Error struct {
	Kind Kind
	// Message says what went wrong, without the kind's prefix.
	Message string
	// Rule names the validation rule that failed (repo_name, issue_number,
	// sources, string_length, type), for KindValidation only.
	Rule string
	// Subject (workspace, interpreter, script) and Reason (missing,
	// not_in_path, directory, not_executable, not_readable) say what is
	// wrong, for KindNotFound only.
	Subject, Reason string
	// Details is additional context: the agent's own error for a non-zero
	// exit, the start of unparsable output.
	Details string
	// ExitCode is the agent's exit code, or -1 when it did not exit by
	// itself (killed, never started).
	ExitCode int
}

func (e *Error) Error() string { return prefixes[e.Kind] + ": " + e.Message }

// Response renders the error in the ADK bridge's response form:
// {"status":"error","error":"...","details":"..."}.
func (e *Error) Response() json.RawMessage {
	b, _ := json.Marshal(struct {
		Status  string `json:"status"`
		Error   string `json:"error"`
		Details string `json:"details,omitempty"`
	}{"error", e.Error(), e.Details})
	return b
}

// KindOf returns err's Kind, or "" when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

func validationError(rule, format string) *Error {
	return &Error{Kind: KindValidation, Rule: rule, Message: format, ExitCode: -1}
}
