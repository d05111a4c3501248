package agenttype

import (
	"fmt"
	"slices"
	"strings"
)

// RunnerLaunchEnv are the variables every launch may set, whatever its
// type: the runner reads them itself (Kandev's first prompt, and the
// session a launch resumes).
var RunnerLaunchEnv = []string{"TASK_DESCRIPTION", "AUGGIE_SESSION_ID"}

// hookNames and hookPrefixes are the variables that can make an agent's
// dynamic loader, shell, interpreter or one of its tools run code or load
// files of the setter's choosing, or redirect whom it trusts and where its
// traffic (and the secrets in it) goes, and the platform's own. Compared
// without regard to case: some tools read them so (npm), and refusing a
// lower-case twin costs nothing. docs/runner-agents.md lists them with reasons.
var (
	hookNames = []string{
		// the C library and loader
		"GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH",
		"HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "RESOLV_HOST_CONF",
		// command lookup, shells, and where programs look for their files
		"PATH", "SHELL", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS",
		"CDPATH", "GLOBIGNORE", "PS1", "PS2", "PS4", "PROMPT_COMMAND",
		"ZDOTDIR", "HOME", "TMPDIR", "TMP", "TEMP",
		// programs that tools start
		"EDITOR", "VISUAL", "PAGER", "MANPAGER", "LESSOPEN", "LESSCLOSE",
		"BROWSER", "SSH_ASKPASS", "SUDO_ASKPASS",
		// interpreters and runtimes
		"NODE_OPTIONS", "NODE_PATH", "NODE_REPL_EXTERNAL_MODULE",
		"_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "MAVEN_OPTS", "GRADLE_OPTS",
		"PHPRC", "PHP_INI_SCAN_DIR", "TCLLIBPATH",
		// compilers and build tools
		"CC", "CXX", "CPP", "LD", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS",
		"MAKEFLAGS", "MFLAGS", "MAKEFILES", "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH",
		"GOFLAGS", "GOROOT", "GOPATH", "GOPROXY", "GONOPROXY", "GOPRIVATE", "GOSUMDB",
		"GONOSUMDB", "GOINSECURE", "GOTOOLCHAIN", "GOENV", "GOEXPERIMENT", "GODEBUG",
		"RUSTC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS", "RUSTDOCFLAGS",
		// configuration files that name commands to run
		"KUBECONFIG", "DOCKER_CONFIG", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
		// whom TLS trusts, and where traffic goes
		"SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "NODE_TLS_REJECT_UNAUTHORIZED",
		"REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
		"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "FTP_PROXY",
		// the trace the runner continues
		"TRACEPARENT", "TRACESTATE",
	}
	hookPrefixes = []string{
		"LD_", "DYLD_", "MALLOC_", "BASH_FUNC_", "XDG_",
		"GIT_",
		"PYTHON", "PIP_", "NPM_CONFIG_", "PERL", "RUBY", "GEM_", "BUNDLE_",
		"JAVA_", "DOTNET_", "CORECLR_", "COMPLUS_", "LUA_",
		"CGO_", "RUSTUP_", "CARGO_",
		"OPENSSL_",
		// the runner's, agent-host's and telemetry's own settings
		"CONCLAVE_", "OTEL_",
	}
)

// HookVariable reports whether name is a variable a launch may never set,
// even where its type's launch_env would allow it: one that can make the
// agent's loader, shell, interpreter or tools run code, or that belongs
// to the platform (see hookNames). Only the operator sets these, in the
// type's env.
func HookVariable(name string) bool {
	upper := strings.ToUpper(name)
	if slices.Contains(hookNames, upper) {
		return true
	}
	for _, p := range hookPrefixes {
		if strings.HasPrefix(upper, p) {
			return true
		}
	}
	return false
}

// ValidEnvName reports whether name is a portable environment variable
// name: letters, digits and '_', not starting with a digit, at most 256
// bytes.
func ValidEnvName(name string) bool {
	if name == "" || len(name) > 256 {
		return false
	}
	for i, r := range name {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// validEnvPattern reports whether p is a name, or a name's prefix followed
// by '*'.
func validEnvPattern(p string) bool {
	return ValidEnvName(strings.TrimSuffix(p, "*"))
}

// matchEnv reports whether one of patterns (names, and prefixes ending in
// '*') matches name exactly (case matters: these are names the agent reads).
func matchEnv(patterns []string, name string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if p == name {
			return true
		}
	}
	return false
}

// LaunchEnvAllowed is what a launch of t may set in its env, hook
// variables aside (CheckLaunchVariable refuses those whatever this says):
// the runner's own variables, t's required_env and t's launch_env (names
// and PREFIX* patterns).
func (t Type) LaunchEnvAllowed() []string {
	return slices.Concat(RunnerLaunchEnv, t.RequiredEnv, t.LaunchEnv)
}

// EnvError is a variable a launch may not set.
type EnvError struct {
	Name string
	// Hook: it is a hook variable, refused whatever the type allows.
	Hook bool
	// Allowed is what the launch may set (when not Hook).
	Allowed []string
}

func (e *EnvError) Error() string {
	if e.Hook {
		return fmt.Sprintf("env variable %s may not be set by a launch: it can make the agent's loader, shell, interpreter or tools run code, or it is the platform's own; only the agent type's env sets it", e.Name)
	}
	return fmt.Sprintf("env variable %s is not one a launch of this agent type may set (allowed: %s)", e.Name, strings.Join(e.Allowed, ", "))
}

// CheckLaunchVariable is nil when allowed (names and PREFIX* patterns, as
// LaunchEnvAllowed returns them) let a launch set name, and an *EnvError
// otherwise.
func CheckLaunchVariable(allowed []string, name string) error {
	switch {
	case HookVariable(name):
		return &EnvError{Name: name, Hook: true}
	case !matchEnv(allowed, name):
		return &EnvError{Name: name, Allowed: allowed}
	}
	return nil
}

// CheckLaunchEnv checks every variable of a launch's env (sorted, so the
// first bad name is always the same one).
func (t Type) CheckLaunchEnv(env map[string]string) error {
	allowed := t.LaunchEnvAllowed()
	for _, name := range sortedKeys(env) {
		if err := CheckLaunchVariable(allowed, name); err != nil {
			return err
		}
	}
	return nil
}

// LaunchSet is the names in env, an agent's whole environment as an
// executor is given it, that t's own env does not set to the same value:
// those its launch set. TRACEPARENT, which the runner sets, is not one.
func (t Type) LaunchSet(env map[string]string) []string {
	var out []string
	for _, name := range sortedKeys(env) {
		if v, ok := t.Env[name]; (ok && v == env[name]) || name == "TRACEPARENT" {
			continue
		}
		out = append(out, name)
	}
	return out
}

// CheckAgentEnv is an executor's last check of an agent's whole
// environment: every variable its launch set (LaunchSet) must be one a
// launch of t may set. It catches a launch stored before the rule, or one
// whose type has changed since.
func (t Type) CheckAgentEnv(env map[string]string) error {
	allowed := t.LaunchEnvAllowed()
	for _, name := range t.LaunchSet(env) {
		if err := CheckLaunchVariable(allowed, name); err != nil {
			return fmt.Errorf("agent type %s: %w", t.ID, err)
		}
	}
	return nil
}

func sortedKeys(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// validateEnvNames checks the type's required_env and launch_env: valid
// names (and PREFIX* patterns in launch_env), none a hook variable, which a
// launch can never set.
func (t Type) validateEnvNames() error {
	for _, name := range t.RequiredEnv {
		switch {
		case !ValidEnvName(name):
			return fmt.Errorf("agent type %s: required_env %q is not a variable name", t.ID, name)
		case HookVariable(name):
			return fmt.Errorf("agent type %s: required_env %s can make the agent's loader, shell, interpreter or tools run code (docs/runner-agents.md), so a launch may never set it: set it in the type's env", t.ID, name)
		}
	}
	for _, p := range t.LaunchEnv {
		switch {
		case !validEnvPattern(p):
			return fmt.Errorf("agent type %s: launch_env %q is not a variable name or a name's prefix followed by '*'", t.ID, p)
		case HookVariable(strings.TrimSuffix(p, "*")):
			return fmt.Errorf("agent type %s: launch_env %s names variables that can make the agent's loader, shell, interpreter or tools run code (docs/runner-agents.md), which a launch may never set: set them in the type's env", t.ID, p)
		}
	}
	for name := range t.Env {
		if !ValidEnvName(name) {
			return fmt.Errorf("agent type %s: env %q is not a variable name", t.ID, name)
		}
	}
	return nil
}
