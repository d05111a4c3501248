package policy_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/functions/librarian/config"
	"github.com/conclave-ai/conclave/functions/librarian/internal/policy"
)

func TestShippedFilesLoad(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(config.Files, "config")
	if err != nil {
		t.Fatal(err)
	}
	claude, ok := p.Agent("claude-3")
	if !ok {
		t.Fatal("claude-3 is not registered")
	}
	if claude.RateLimit != (policy.Rate{Count: 100, Window: time.Hour}) || claude.MaxRequestSize != 50<<10 ||
		!claude.Can("write") || claude.MayTarget("docs") || !claude.MayTarget("design") {
		t.Fatalf("claude-3 = %+v", claude)
	}
	gemini, _ := p.Agent("gemini-pro")
	if len(gemini.AllowedTargets) != len(policy.TargetTypes) || gemini.MaxRequestSize != 100<<10 {
		t.Fatalf("gemini-pro = %+v: [all] is every target, and the size limit defaults to max_content_size", gemini)
	}
	want := policy.Protocol{
		Version:    "1.0",
		Timeouts:   policy.Timeouts{Validation: 5 * time.Second, Response: 10 * time.Second, Escalation: 24 * time.Hour},
		Limits:     policy.Limits{MaxContentSize: 100 << 10, MaxReferences: 20, MaxDeviations: 5, MaxRetryAttempts: 3},
		Compliance: policy.Compliance{StrictMode: true, RequireRationale: true, EnforceReferences: true, RequireKnownTargets: true},
	}
	if p.Protocol != want {
		t.Fatalf("protocol = %+v, want %+v", p.Protocol, want)
	}
	// The repository's config/ directory is the files compiled in.
	for _, f := range []string{policy.AgentsFile, policy.ProtocolFile} {
		embedded, _ := config.Files.ReadFile(f)
		if _, err := os.Stat("../../config/" + f); err != nil || len(embedded) == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

func TestBadFilesNameFileAndKey(t *testing.T) {
	t.Parallel()
	agents, _ := config.Files.ReadFile(policy.AgentsFile)
	protocol, _ := config.Files.ReadFile(policy.ProtocolFile)
	tests := []struct {
		name             string
		agents, protocol string
		want             string
	}{
		{"bad rate", strings.Replace(string(agents), "100/hour", "100/fortnight", 1), "", "config/agents.yaml: agents.claude-3.rate_limit"},
		{"bad size", strings.Replace(string(agents), "50KB", "fifty", 1), "", "agents.claude-3.max_request_size"},
		{"unknown capability", strings.Replace(string(agents), "[read, suggest]", "[read, fly]", 1), "", `agents.copilot-2.capabilities: "fly"`},
		{"unknown target", strings.Replace(string(agents), "allowed_targets: [code]", "allowed_targets: [kitchen]", 1), "", "agents.copilot-2.allowed_targets"},
		{"no targets", strings.Replace(string(agents), "allowed_targets: [code]", "", 1), "", "agents.copilot-2.allowed_targets: missing"},
		{"misspelt key", strings.Replace(string(agents), "rate_limit: 50/hour", "rate_limt: 50/hour", 1), "", "field rate_limt not found"},
		{"empty registry", "agents: {}\n", "", "config/agents.yaml: agents: no agent"},
		{"empty file", "", "", "config/agents.yaml: the file is empty"},
		{"bad timeout", "", strings.Replace(string(protocol), "5000ms", "soon", 1), "config/protocol.yaml: protocol.timeouts.validation"},
		{"validation over response", "", strings.Replace(string(protocol), "5000ms", "20000ms", 1), "protocol.timeouts.validation: 20s is longer"},
		{"content too big", "", strings.Replace(string(protocol), "max_content_size: 100KB", "max_content_size: 10MB", 1), "protocol.limits.max_content_size"},
		{"negative references", "", strings.Replace(string(protocol), "max_references: 20", "max_references: -1", 1), "protocol.limits.max_references: -1"},
		{"missing switch", "", strings.Replace(string(protocol), "strict_mode: true", "", 1), "protocol.compliance.strict_mode: missing"},
		{"not a bool", "", strings.Replace(string(protocol), "strict_mode: true", "strict_mode: sometimes", 1), "config/protocol.yaml"},
		{"wrong version", "", strings.Replace(string(protocol), `"1.0"`, `"2.0"`, 1), "protocol.version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, p := tt.agents, tt.protocol
			if a == "" && tt.name != "empty file" {
				a = string(agents)
			}
			if p == "" {
				p = string(protocol)
			}
			_, err := policy.Parse([]byte(a), []byte(p), "config")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestRequireKnownTargets: the one key that is not the protocol's is optional,
// on by default, and may be turned off.
func TestRequireKnownTargets(t *testing.T) {
	t.Parallel()
	agents, _ := config.Files.ReadFile(policy.AgentsFile)
	protocol, _ := config.Files.ReadFile(policy.ProtocolFile)
	for _, tt := range []struct {
		name, line string
		want       bool
	}{{"left out", "", true}, {"on", "    require_known_targets: true\n", true}, {"off", "    require_known_targets: false\n", false}} {
		p, err := policy.Parse(agents, []byte(strings.Replace(string(protocol), "    strict_mode: true\n", "    strict_mode: true\n"+tt.line, 1)), "config")
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if p.Protocol.Compliance.RequireKnownTargets != tt.want {
			t.Errorf("%s: require_known_targets = %v", tt.name, p.Protocol.Compliance.RequireKnownTargets)
		}
	}
}

func TestParseRateAndSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]policy.Rate{"60/minute": {60, time.Minute}, "1/second": {1, time.Second}, " 5 / day ": {5, 24 * time.Hour}} {
		if got, err := policy.ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0/hour", "-1/hour", "10", "10/week", "x/hour"} {
		if _, err := policy.ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
	for in, want := range map[string]int64{"512": 512, "512B": 512, "50KB": 50 << 10, "1mb": 1 << 20} {
		if got, err := policy.ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0", "1GB", "KB", "-5KB"} {
		if _, err := policy.ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
}

func TestAddAgent(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(config.Files, "config")
	if err != nil {
		t.Fatal(err)
	}
	if p.AddAgent("claude-3") {
		t.Error("an agent of agents.yaml was replaced")
	}
	if !p.AddAgent("npm-example") {
		t.Fatal("not added")
	}
	a, _ := p.Agent("npm-example")
	if !a.Can("write") || !a.Can("read") || len(a.AllowedTargets) != len(policy.TargetTypes) || a.MaxRequestSize != p.Protocol.Limits.MaxContentSize {
		t.Fatalf("added %+v", a)
	}
}
