package hybrid

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, out string
		status    string // want a Response with this status
		err       string // or an invalid_json error containing this
	}{
		{"success data", `{"status":"success","data":{"labels":["bug"],"confidence":0.95}}`, "success", ""},
		{"success result", "\n  {\"status\":\"success\",\"result\":42}\n\n", "success", ""},
		{"agent error", `{"status":"error","error":"Invalid input: x","details":"more"}`, "error", ""},
		{"empty", "", "", "wrote nothing to stdout"},
		{"whitespace", " \n\t ", "", "wrote nothing to stdout"},
		{"not json", "hello world", "", "not a JSON object"},
		{"debug print before", "debug: starting\nx=1\n{\"status\":\"success\",\"data\":1}\n", "", "before its JSON object"},
		{"text after", `{"status":"success"} done`, "", "after its JSON object"},
		{"two objects", `{"status":"success"}{"status":"success"}`, "", "after its JSON object"},
		{"array", `[{"status":"success"}]`, "", "not a JSON object"},
		{"truncated", `{"status":"success","data":`, "", "not valid JSON"},
		{"no status", `{"data":1}`, "", `no "status"`},
		{"bad status", `{"status":"ok"}`, "", `"status": "ok"`},
		{"error without message", `{"status":"error"}`, "", `no "error" message`},
		{"status wrong type", `{"status":1}`, "", "protocol's fields"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := ParseOutput([]byte(tt.out))
			if tt.err != "" {
				if KindOf(err) != KindInvalidJSON || !strings.Contains(err.Error(), tt.err) || !strings.HasPrefix(err.Error(), "Invalid JSON: ") {
					t.Fatalf("ParseOutput = %v, %v; want Invalid JSON containing %q", r, err, tt.err)
				}
				return
			}
			if err != nil || r.Status != tt.status || !json.Valid(r.Object) {
				t.Fatalf("ParseOutput = %+v, %v; want status %s", r, err, tt.status)
			}
		})
	}
}

func TestParseOutputKeepsWholeObject(t *testing.T) {
	t.Parallel()
	r, err := ParseOutput([]byte(`{"status":"success","data":{"a":1},"extra":"kept"}`))
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal(r.Object, &obj); err != nil || obj["extra"] != "kept" {
		t.Fatalf("Object = %s", r.Object)
	}
	if string(r.Data) != `{"a":1}` {
		t.Fatalf("Data = %s", r.Data)
	}
}

func TestErrorResponse(t *testing.T) {
	t.Parallel()
	e := validationError(RuleRepoName, "Invalid repo_name format")
	var got map[string]string
	if err := json.Unmarshal(e.Response(), &got); err != nil {
		t.Fatal(err)
	}
	if got["status"] != "error" || got["error"] != "Validation error: Invalid repo_name format" {
		t.Fatalf("Response = %s", e.Response())
	}
}

// FuzzParseOutput: any stdout gives either a well-formed Response or an
// invalid_json Error with a bounded excerpt, never a panic.
func FuzzParseOutput(f *testing.F) {
	for _, s := range []string{
		"", `{"status":"success","data":{}}`, `{"status":"error","error":"x","details":{"a":[1]}}`,
		"print\n{\"status\":\"success\"}", `{"status":"success"} trailing`, `{"status":`, "\xff\xfe{", "[1,2]",
		`{"status":"success","data":"` + strings.Repeat("é", 300) + `"}`, "a\n{\n\"status\":\"success\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		r, err := ParseOutput(out)
		if err != nil {
			e, ok := err.(*Error)
			if !ok || e.Kind != KindInvalidJSON || r != nil {
				t.Fatalf("ParseOutput error %T %v with response %v", err, err, r)
			}
			if len(e.Details) > 204 {
				t.Fatalf("details not bounded: %d bytes", len(e.Details))
			}
			return
		}
		if r.Status != StatusSuccess && r.Status != StatusError {
			t.Fatalf("status %q accepted", r.Status)
		}
		if r.Status == StatusError && r.Error == "" {
			t.Fatal("error response without message accepted")
		}
		if !json.Valid(r.Object) {
			t.Fatalf("Object is not JSON: %q", r.Object)
		}
	})
}
