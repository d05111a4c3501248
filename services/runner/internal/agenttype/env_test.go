package agenttype

import (
	"errors"
	"strings"
	"testing"
)

func TestHookVariable(t *testing.T) {
	t.Parallel()
	for name, hook := range map[string]bool{
		"LD_PRELOAD": true, "LD_LIBRARY_PATH": true, "LD_AUDIT": true, "DYLD_INSERT_LIBRARIES": true,
		"PATH": true, "BASH_ENV": true, "ENV": true, "SHELLOPTS": true, "PS4": true, "IFS": true,
		"PYTHONWARNINGS": true, "PYTHONPATH": true, "PYTHONSTARTUP": true, "BROWSER": true,
		"NODE_OPTIONS": true, "NODE_PATH": true, "npm_config_node_options": true, "NPM_CONFIG_SCRIPT_SHELL": true,
		"PERL5OPT": true, "PERLLIB": true, "RUBYOPT": true, "GIT_SSH_COMMAND": true, "GIT_CONFIG_GLOBAL": true,
		"JAVA_TOOL_OPTIONS": true, "_JAVA_OPTIONS": true, "GOFLAGS": true, "GLIBC_TUNABLES": true,
		"MALLOC_CHECK_": true, "GCONV_PATH": true, "HOME": true, "XDG_CONFIG_HOME": true, "KUBECONFIG": true,
		"HTTPS_PROXY": true, "https_proxy": true, "SSL_CERT_FILE": true, "OPENSSL_CONF": true,
		"CONCLAVE_AGENT_HOST_PERMISSION": true, "OTEL_EXPORTER_OTLP_ENDPOINT": true, "TRACEPARENT": true,
		"ld_preload": true, "Path": true,
		"TASK_DESCRIPTION": false, "AUGGIE_SESSION_ID": false, "AUGMENT_SESSION_AUTH": false,
		"BUB_WORKSPACE": false, "BUB_TOKEN": false, "OPENAI_API_KEY": false, "API_KEY": false,
		"NODE_ENV": false, "LANG": false, "GOOGLE_API_KEY": false, "PATHFINDER": false, "ENVIRONMENT": false,
		"LOG_LEVEL": false, "RUST_LOG": false,
	} {
		if got := HookVariable(name); got != hook {
			t.Errorf("HookVariable(%q) = %v, want %v", name, got, hook)
		}
	}
}

// The operator's launch_env and required_env are checked when the types
// are loaded: a hook variable there is an error naming it.
func TestParseLaunchEnv(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, entry, err string
	}{
		{"names and prefixes", "    launch_env: [OPENAI_API_KEY, BUB_*]\n", ""},
		{"a prefix wider than a hook family", "    launch_env: [P*, L*]\n", ""},
		{"a hook name", "    launch_env: [LD_PRELOAD]\n", "launch_env LD_PRELOAD"},
		{"a hook family", "    launch_env: [PYTHON*]\n", "launch_env PYTHON*"},
		{"inside a hook family", "    launch_env: [GIT_SSH*]\n", "launch_env GIT_SSH*"},
		{"the platform's own", "    launch_env: [CONCLAVE_AGENT_HOST_PERMISSION]\n", "launch_env CONCLAVE_AGENT_HOST_PERMISSION"},
		{"everything", "    launch_env: ['*']\n", `launch_env "*"`},
		{"a star inside", "    launch_env: [A*B]\n", `launch_env "A*B"`},
		{"not a name", "    launch_env: [A-B]\n", `launch_env "A-B"`},
		{"a required hook", "    required_env: [NODE_OPTIONS]\n", "required_env NODE_OPTIONS"},
		{"a required non-name", "    required_env: ['A=B']\n", `required_env "A=B"`},
		{"the type's own may hook", "    env: {LD_LIBRARY_PATH: /opt/lib, PATH: /opt/bin}\n", ""},
		{"the type's own env names", "    env: {'A B': x}\n", `env "A B"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte("agent_types:\n  - id: a\n    command: [x]\n" + tt.entry))
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want one line naming %q", err, tt.err)
			}
		})
	}
}

func TestCheckLaunchEnv(t *testing.T) {
	t.Parallel()
	typ := Type{ID: "a", RequiredEnv: []string{"API_KEY"}, LaunchEnv: []string{"BUB_*", "MODEL", "P*"}}
	for _, tt := range []struct {
		name string
		env  map[string]string
		bad  string
		hook bool
	}{
		{"nothing", nil, "", false},
		{"the runner's, required and allowed", map[string]string{"TASK_DESCRIPTION": "x", "AUGGIE_SESSION_ID": "s", "API_KEY": "k", "BUB_AGENT_ID": "a", "MODEL": "m", "PROJECT": "p"}, "", false},
		{"not allowed", map[string]string{"API_KEY": "k", "MODELS": "m"}, "MODELS", false},
		{"case matters for the allowlist", map[string]string{"model": "m"}, "model", false},
		{"a hook the allowlist covers", map[string]string{"PYTHONWARNINGS": "x", "PROJECT": "p"}, "PYTHONWARNINGS", true},
		{"the first bad name, in order", map[string]string{"ZED": "z", "PATH": "/tmp", "BASH_ENV": "/x"}, "BASH_ENV", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := typ.CheckLaunchEnv(tt.env)
			if tt.bad == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var envErr *EnvError
			if !errors.As(err, &envErr) || envErr.Name != tt.bad || envErr.Hook != tt.hook {
				t.Fatalf("got %v, want %s refused (hook %v)", err, tt.bad, tt.hook)
			}
		})
	}
}

// An executor checks the whole environment: what the type's own env sets
// (with its value) and TRACEPARENT pass; a launch's must be allowed.
func TestCheckAgentEnv(t *testing.T) {
	t.Parallel()
	typ := Type{ID: "a", Env: map[string]string{"LD_LIBRARY_PATH": "/opt/lib", "LOG_LEVEL": "info"}, LaunchEnv: []string{"MODEL"}}
	for _, tt := range []struct {
		name string
		env  map[string]string
		set  string
		bad  string
	}{
		{"the type's and the runner's", map[string]string{"LD_LIBRARY_PATH": "/opt/lib", "LOG_LEVEL": "info", "TRACEPARENT": "00-x", "TASK_DESCRIPTION": "go"}, "TASK_DESCRIPTION", ""},
		{"an allowed one", map[string]string{"LD_LIBRARY_PATH": "/opt/lib", "MODEL": "m"}, "MODEL", ""},
		{"the type's hook with another value", map[string]string{"LD_LIBRARY_PATH": "/tmp/evil"}, "LD_LIBRARY_PATH", "LD_LIBRARY_PATH"},
		{"a type's variable the launch may not set", map[string]string{"LOG_LEVEL": "debug"}, "LOG_LEVEL", "LOG_LEVEL"},
		{"a stored launch's hook", map[string]string{"LD_PRELOAD": "/tmp/x.so"}, "LD_PRELOAD", "LD_PRELOAD"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := strings.Join(typ.LaunchSet(tt.env), ","); got != tt.set {
				t.Errorf("LaunchSet = %q, want %q", got, tt.set)
			}
			err := typ.CheckAgentEnv(tt.env)
			var envErr *EnvError
			switch {
			case tt.bad == "" && err != nil:
				t.Fatal(err)
			case tt.bad != "" && (!errors.As(err, &envErr) || envErr.Name != tt.bad):
				t.Fatalf("got %v, want %s refused", err, tt.bad)
			}
		})
	}
}
