package supervisor

import (
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

// A oneshot agent runs in the runner's own process tree: a launch whose
// env the API would now refuse (one stored before the rule, or whose type
// changed since) is refused before it is run, and the type's own env
// reaches it.
func TestOneshotAgentEnv(t *testing.T) {
	t.Parallel()
	typ := agenttype.Type{ID: "py", Command: []string{"/usr/bin/python3", "agent.py"}, Protocol: agenttype.ProtocolOneshot,
		Env: map[string]string{"PYTHONPATH": "/opt/lib"}, LaunchEnv: []string{"P*", "MODEL"}, Enabled: true}
	for _, tt := range []struct {
		name string
		env  map[string]string
		bad  string
	}{
		{"the type's own and an allowed one", map[string]string{"PYTHONPATH": "/opt/lib", "MODEL": "m", "TRACEPARENT": "00-x"}, ""},
		{"a hook the type's launch_env covers", map[string]string{"PYTHONWARNINGS": "all:0:antigravity.x:0:0"}, "PYTHONWARNINGS"},
		{"the type's hook with the launch's value", map[string]string{"PYTHONPATH": "/tmp/evil"}, "PYTHONPATH"},
		{"not allowed", map[string]string{"OTHER": "x"}, "OTHER"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, err := oneshotAgent(typ, "/workspace", tt.env, func(string) {})
			if tt.bad == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(strings.Join(a.Env, " "), "PYTHONPATH=/opt/lib") {
					t.Errorf("env %v", a.Env)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.bad) {
				t.Fatalf("got %v, want %s refused", err, tt.bad)
			}
		})
	}
}
