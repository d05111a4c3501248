package governance

import (
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
	"github.com/conclave-ai/conclave/pkg/ids"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// The protocol's request types and actions.
const (
	TypeApproval = "APPROVAL"
	TypeQuery    = "QUERY"
	TypeValidate = "VALIDATE"
	TypeReport   = "REPORT"

	ActionCreate = "create"
	ActionModify = "modify"
	ActionDelete = "delete"
	ActionRead   = "read"
)

var (
	requestTypes = []string{TypeApproval, TypeQuery, TypeValidate, TypeReport}
	actions      = []string{ActionCreate, ActionModify, ActionDelete, ActionRead}
)

// Field limits that hold whatever protocol.yaml says, so that one request
// can always be stored as one item.
const (
	maxIDBytes        = 128
	maxPathBytes      = 512
	maxRationaleBytes = 16 << 10
	maxRiskBytes      = 4 << 10
	maxListEntryBytes = 256
	maxContextUsed    = 50
	maxChangesMade    = 100
	maxDeviationBytes = 2 << 10
)

// InputError is a request the API refuses before any rule runs: an HTTP
// status, a stable code and the field at fault.
type InputError struct {
	Status  int
	Code    string
	Field   string
	Message string
}

func (e *InputError) Error() string { return e.Message }

func badInput(field, code, format string, args ...any) *InputError {
	return &InputError{Status: http.StatusBadRequest, Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// CheckShape refuses what no rule should see: unknown enum values, unsafe
// paths, oversized content and over-long lists. Missing fields are left to
// the required-fields rule, which answers them as the protocol does, with a
// rejection that lists them.
func CheckShape(r *librarianv1.AgentRequest, limits policy.Limits) *InputError {
	if r.GetRequestType() != "" && !slices.Contains(requestTypes, r.GetRequestType()) {
		return badInput("request_type", "unknown_request_type", "request_type %q is not one of %s", clip(r.GetRequestType()), strings.Join(requestTypes, ", "))
	}
	if r.GetAction() != "" && !slices.Contains(actions, r.GetAction()) {
		return badInput("action", "unknown_action", "action %q is not one of %s", clip(r.GetAction()), strings.Join(actions, ", "))
	}
	if r.GetTargetType() != "" && !slices.Contains(policy.TargetTypes, r.GetTargetType()) {
		return badInput("target_type", "unknown_target_type", "target_type %q is not one of %s", clip(r.GetTargetType()), strings.Join(policy.TargetTypes, ", "))
	}
	if r.TargetPath != nil {
		if err := CheckPath(r.GetTargetPath()); err != nil {
			return badInput("target_path", "invalid_target_path", "target_path: %s", err)
		}
	}
	for field, v := range map[string]string{"agent_id": r.GetAgentId(), "session_id": r.GetSessionId(), "target_id": r.GetTargetId(), "request_id": r.GetRequestId()} {
		if len(v) > maxIDBytes {
			return badInput(field, "field_too_long", "%s is longer than %d bytes", field, maxIDBytes)
		}
	}
	// The ids the Librarian keys records by follow pkg/ids (agent_id is
	// the rule every service shares); a missing one is left to the
	// required-fields rule.
	for _, c := range []struct {
		kind ids.Kind
		v    string
	}{{ids.AgentID, r.GetAgentId()}, {ids.LibrarianRequestID, r.GetRequestId()}} {
		if err := c.kind.CheckOptional(c.v); err != nil {
			return badInput(c.kind.Field, "invalid_"+c.kind.Field, "%s", err)
		}
	}
	if n := int64(len(r.GetContent())); n > limits.MaxContentSize {
		return &InputError{Status: http.StatusRequestEntityTooLarge, Code: "content_too_large", Field: "content",
			Message: fmt.Sprintf("content is %d bytes; max_content_size is %d", n, limits.MaxContentSize)}
	}
	if len(r.GetRationale()) > maxRationaleBytes || len(r.GetRiskAssessment()) > maxRiskBytes {
		return badInput("rationale", "field_too_long", "rationale may have %d bytes and risk_assessment %d", maxRationaleBytes, maxRiskBytes)
	}
	if n := len(r.GetReferences()); n > limits.MaxReferences {
		return badInput("references", "too_many_references", "%d references; max_references is %d", n, limits.MaxReferences)
	}
	if n := len(r.GetDependsOn()); n > limits.MaxReferences {
		return badInput("depends_on", "too_many_dependencies", "%d depends_on entries; max_references is %d", n, limits.MaxReferences)
	}
	if n := len(r.GetDeviations()); n > limits.MaxDeviations {
		return badInput("deviations", "too_many_deviations", "%d deviations; max_deviations is %d", n, limits.MaxDeviations)
	}
	for field, list := range map[string][]string{"references": r.GetReferences(), "depends_on": r.GetDependsOn(), "context_used": r.GetContextUsed(), "changes_made": r.GetChangesMade()} {
		if (field == "context_used" && len(list) > maxContextUsed) || (field == "changes_made" && len(list) > maxChangesMade) {
			return badInput(field, "too_many_entries", "%s has %d entries", field, len(list))
		}
		for _, v := range list {
			if v == "" || len(v) > maxListEntryBytes {
				return badInput(field, "invalid_entry", "each %s entry must be 1 to %d bytes", field, maxListEntryBytes)
			}
		}
	}
	for i, d := range r.GetDeviations() {
		if len(d.GetFields()) == 0 {
			return badInput("deviations", "invalid_deviation", "deviations[%d] is empty", i)
		}
		size := 0
		for k, v := range d.GetFields() {
			if _, isString := v.GetKind().(*structpb.Value_StringValue); !isString {
				return badInput("deviations", "invalid_deviation", "deviations[%d].%s must be a string (deviations are string maps)", i, clip(k))
			}
			size += len(k) + len(v.GetStringValue())
		}
		if size > maxDeviationBytes {
			return badInput("deviations", "invalid_deviation", "deviations[%d] is over %d bytes", i, maxDeviationBytes)
		}
	}
	return nil
}

// CheckPath accepts a clean relative slash-separated path inside the
// repository: no "..", no absolute path, no backslash, no control bytes.
func CheckPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("empty")
	case len(p) > maxPathBytes:
		return fmt.Errorf("longer than %d bytes", maxPathBytes)
	case !utf8.ValidString(p):
		return fmt.Errorf("not UTF-8")
	case strings.HasPrefix(p, "/") || strings.ContainsRune(p, '\\') || (len(p) > 1 && p[1] == ':'):
		return fmt.Errorf("%q must be relative to the repository", clip(p))
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("contains control characters")
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return fmt.Errorf("%q leaves the repository (path traversal)", clip(p))
		}
	}
	if path.Clean(p) != p {
		return fmt.Errorf("%q is not clean; use %q", clip(p), path.Clean(p))
	}
	return nil
}

// clip bounds a client's value before it is echoed in an error.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	for i := n; i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			return s[:i] + "…"
		}
	}
	return ""
}
