package hybrid

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Response is an agent's answer on stdout: {"status":"success","data":...}
// (or "result" instead of "data") or {"status":"error","error":"...",
// "details":...}.
type Response struct {
	Status  string          `json:"status"`
	Data    json.RawMessage `json:"data,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   string          `json:"error,omitempty"`
	Details json.RawMessage `json:"details,omitempty"`
	// Object is the whole JSON object as the agent wrote it, extra fields
	// included; the bridge returns it as the tool's structured content.
	Object json.RawMessage `json:"-"`
}

// The two statuses of the protocol.
const (
	StatusSuccess = "success"
	StatusError   = "error"
)

// ParseOutput parses an agent's complete stdout: exactly one JSON object with
// a "status" of "success" or "error" (an error needs an "error" message),
// surrounded by nothing but whitespace. Anything else is an *Error of kind
// KindInvalidJSON whose message says what was wrong: nothing written, text
// (say a debug print) before the JSON, text after it, or not JSON at all.
func ParseOutput(stdout []byte) (*Response, error) {
	trimmed := bytes.TrimSpace(stdout)
	if len(trimmed) == 0 {
		return nil, invalidJSON("the agent wrote nothing to stdout; it must print one JSON object", "")
	}
	if trimmed[0] != '{' {
		if at := jsonObjectStart(trimmed); at > 0 {
			return nil, invalidJSON("the agent printed text to stdout before its JSON object (a debug print?); stdout is reserved for the JSON response, log to stderr",
				excerpt(trimmed[:at]))
		}
		return nil, invalidJSON("agent output is not a JSON object", excerpt(trimmed))
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	var obj json.RawMessage
	if err := dec.Decode(&obj); err != nil {
		return nil, invalidJSON(fmt.Sprintf("agent output is not valid JSON: %v", err), excerpt(trimmed))
	}
	if rest := bytes.TrimSpace(trimmed[dec.InputOffset():]); len(rest) > 0 {
		return nil, invalidJSON("the agent printed text to stdout after its JSON object; stdout must hold exactly one JSON object", excerpt(rest))
	}
	var r Response
	if err := json.Unmarshal(obj, &r); err != nil {
		return nil, invalidJSON(fmt.Sprintf("agent response does not have the protocol's fields: %v", err), excerpt(trimmed))
	}
	switch r.Status {
	case StatusSuccess:
	case StatusError:
		if r.Error == "" {
			return nil, invalidJSON(`agent response has "status": "error" but no "error" message`, excerpt(trimmed))
		}
	case "":
		return nil, invalidJSON(`agent response has no "status" field; it must be "success" or "error"`, excerpt(trimmed))
	default:
		return nil, invalidJSON(fmt.Sprintf(`agent response has "status": %q; it must be "success" or "error"`, r.Status), excerpt(trimmed))
	}
	r.Object = obj
	return &r, nil
}

// jsonObjectStart returns the offset of the first line that starts a valid
// JSON object running to the end of out, or -1.
func jsonObjectStart(out []byte) int {
	for i := 0; i < len(out); i++ {
		if out[i] != '\n' {
			continue
		}
		rest := bytes.TrimSpace(out[i+1:])
		if len(rest) > 0 && rest[0] == '{' && json.Valid(rest) {
			return i + 1
		}
	}
	return -1
}

func invalidJSON(msg, details string) *Error {
	return &Error{Kind: KindInvalidJSON, Message: msg, Details: details, ExitCode: 0}
}

// excerpt is the start of b, for an error's details: enough to recognise the
// output, never the whole of a large one.
func excerpt(b []byte) string {
	const max = 200
	s := string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
