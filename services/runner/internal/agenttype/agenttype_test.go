package agenttype

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/hybrid"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, yaml, err string
	}{
		{"empty file", "", ""},
		{"one type", "agent_types:\n  - id: a\n    command: [x]\n    timeout: 30m\n    protocol: acp\n    enabled: true\n", ""},
		{"unknown key", "agent_types:\n  - id: a\n    comand: [x]\n", "comand"},
		{"bad protocol", "agent_types:\n  - id: a\n    command: [x]\n    protocol: grpc\n", `protocol "grpc"`},
		{"bad permission", "agent_types:\n  - id: a\n    command: [x]\n    permission: maybe\n", `permission "maybe"`},
		{"librarian", "agent_types:\n  - id: a\n    command: [x]\n    permission: librarian\n    approval_timeout: 10m\n", ""},
		{"approval_timeout without librarian", "agent_types:\n  - id: a\n    command: [x]\n    permission: allow\n    approval_timeout: 10m\n", "librarian only"},
		{"negative approval_timeout", "agent_types:\n  - id: a\n    command: [x]\n    permission: librarian\n    approval_timeout: -1s\n", "negative approval_timeout"},
		{"bad id", "agent_types:\n  - id: A B\n    command: [x]\n", "id"},
		{"duplicate", "agent_types:\n  - id: a\n    command: [x]\n  - id: a\n    command: [y]\n", "twice"},
		{"enabled without command or image", "agent_types:\n  - id: a\n    enabled: true\n", "needs a command"},
		{"not YAML", "agent_types: [", "agent types"},
		{"validation on an acp type", "agent_types:\n  - id: a\n    command: [x]\n    protocol: acp\n    validate_inputs: false\n", "oneshot only"},
		{"negative max_param_length", "agent_types:\n  - id: a\n    command: [x]\n    protocol: oneshot\n    max_param_length: -1\n", "negative max_param_length"},
		{"auth_method", "agent_types:\n  - id: a\n    command: [x]\n    protocol: acp\n    auth_method: gemini-api-key\n", ""},
		{"auth_method with a space", "agent_types:\n  - id: a\n    command: [x]\n    auth_method: api key\n", "auth_method"},
		{"auth_method on a kandev agent", "agent_types:\n  - id: a\n    command: [x]\n    protocol: kandev\n    auth_method: key\n", "for ACP agents"},
		// Enabled unless it says otherwise: an entry without a command or
		// image is refused rather than kept disabled.
		{"without command or image", "agent_types:\n  - id: a\n", "needs a command"},
		{"disabled without command or image", "agent_types:\n  - id: a\n    enabled: false\n", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			types, err := Parse([]byte(tt.yaml))
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("got %v (%+v), want an error mentioning %q", err, types, tt.err)
			}
		})
	}
}

// TestEnabledByDefault: an entry of the file without enabled is enabled;
// enabled: false disables it. (It was disabled, and a launch of it said
// only "disabled".)
func TestEnabledByDefault(t *testing.T) {
	t.Parallel()
	types, err := Parse([]byte("agent_types:\n  - id: plain\n    command: [x]\n  - id: off\n    command: [x]\n    enabled: false\n  - id: on\n    command: [x]\n    enabled: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, typ := range types {
		got[typ.ID] = typ.Enabled
	}
	if want := map[string]bool{"plain": true, "off": false, "on": true}; !reflect.DeepEqual(got, want) {
		t.Fatalf("enabled %v, want %v", got, want)
	}
	r, err := New(types...)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Summary(), "off (detect, x, disabled); on (detect, x); plain (detect, x)"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

func TestOneshotValidation(t *testing.T) {
	t.Parallel()
	off := false
	for _, tt := range []struct {
		name         string
		typ          Type
		validate     bool
		maxParamSize int
	}{
		{"defaults are the bridge's", Type{}, true, hybrid.DefaultMaxParamLength},
		{"switched off", Type{ValidateInputs: &off}, false, hybrid.DefaultMaxParamLength},
		{"own limit", Type{MaxParamLength: 50}, true, 50},
	} {
		validate, limit := tt.typ.OneshotValidation()
		if validate != tt.validate || limit != tt.maxParamSize {
			t.Errorf("%s: got (%t, %d), want (%t, %d)", tt.name, validate, limit, tt.validate, tt.maxParamSize)
		}
	}
}

func TestLoadOverlaysDefaults(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "types.yaml")
	if err := os.WriteFile(path, []byte("agent_types:\n  - id: augment-agent\n    command: [auggie, --acp]\n    protocol: kandev\n    required_env: [AUGMENT_SESSION_AUTH]\n    enabled: true\n  - id: mine\n    command: [x]\n    enabled: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	aug, ok := r.Get("augment-agent")
	if !ok || len(aug.Command) != 2 || aug.Image != "" {
		t.Errorf("the file did not replace the default: %+v", aug)
	}
	mine, _ := r.Get("mine")
	if mine.EffectiveTimeout() != time.Hour {
		t.Errorf("default timeout %s", mine.EffectiveTimeout())
	}
	if got := aug.MissingEnv(map[string]string{}); got != "AUGMENT_SESSION_AUTH" {
		t.Errorf("MissingEnv = %q", got)
	}
	if got := aug.MissingEnv(map[string]string{"AUGMENT_SESSION_AUTH": "x"}); got != "" {
		t.Errorf("MissingEnv = %q", got)
	}
	if len(r.List()) != 2 {
		t.Errorf("List = %+v", r.List())
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestRunnableOn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		typ      Type
		executor string
		want     string // in the error; "" for runnable
	}{
		{"a command, locally", Type{ID: "a", Command: []string{"agent"}}, "local", ""},
		{"an image only, locally", Type{ID: "a", Image: "img"}, "local", "no command"},
		{"an image and a command, on Kubernetes", Type{ID: "a", Image: "img", Command: []string{"agent"}}, "kubernetes", ""},
		{"a command only, on Kubernetes", Type{ID: "a", Command: []string{"agent"}}, "kubernetes", "no image"},
		{"an image only, on Kubernetes", Type{ID: "a", Image: "img"}, "kubernetes", "no command"},
		{"oneshot without an image, on Kubernetes", Type{ID: "a", Protocol: ProtocolOneshot, Command: []string{"tool.py"}}, "kubernetes", ""},
		{"oneshot without a command", Type{ID: "a", Protocol: ProtocolOneshot, Image: "img"}, "kubernetes", "no command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.typ.RunnableOn(tt.executor)
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("RunnableOn(%s): %v, want %q", tt.executor, err, tt.want)
			}
		})
	}
}
