package toolset

import (
	"fmt"
	"os"

	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/services/bridge/internal/agentconfig"
)

// Finding is one result of Diagnose: a check that passed, or a problem with
// the fix to make.
type Finding struct {
	OK bool
	// Warning marks a finding that may be intended (a variable an agent
	// asks for is not set) and does not fail the diagnosis.
	Warning bool
	What    string
	Fix     string
}

// Diagnose checks the configuration, the workspace, and each agent's
// script, interpreter and permissions, and the variables it expects, and
// suggests a fix for every problem.
func Diagnose(cfg Settings) []Finding {
	agents, err := agentconfig.Load(cfg.ConfigFile, cfg.Workspace, cfg.lookup)
	if err != nil {
		fix := "correct the key named in the message in config.yaml (docs/bridge.md describes every key)"
		if isNotExist(err) {
			fix = "set CONCLAVE_BRIDGE_CONFIG (or --bridge-config) to your config.yaml; examples/tool-agents/config.yaml is a starting point"
		}
		return []Finding{{What: fmt.Sprintf("config: %v", err), Fix: fix}}
	}
	out := []Finding{{OK: true, What: fmt.Sprintf("config %s: %d agents, validate_inputs=%t, max_param_length=%d",
		agents.File, len(agents.Agents), agents.ValidateInputs, agents.MaxParamLength)}}
	if fi, err := os.Stat(agents.Workspace); err != nil || !fi.IsDir() {
		out = append(out, Finding{What: fmt.Sprintf("workspace %s is not an accessible directory", agents.Workspace),
			Fix: "create it, or set workspace: in config.yaml (relative to the file) or CONCLAVE_BRIDGE_WORKSPACE"})
	} else {
		out = append(out, Finding{OK: true, What: "workspace " + agents.Workspace})
	}
	for _, a := range agents.Agents {
		problems := a.Run.Problems()
		for _, p := range problems {
			if p.Subject == hybrid.SubjectWorkspace {
				continue // reported once above
			}
			out = append(out, Finding{What: fmt.Sprintf("agent %s: %s", a.Name, p.Message), Fix: fixFor(a, p)})
		}
		if len(problems) == 0 {
			out = append(out, Finding{OK: true, What: fmt.Sprintf("agent %s: %s %s", a.Name, a.Run.Interpreter, a.Run.Script)})
		}
		for _, kv := range missingEnv(a, cfg) {
			out = append(out, Finding{Warning: true, What: fmt.Sprintf("agent %s: %s is not set in the bridge's environment", a.Name, kv),
				Fix: fmt.Sprintf("export %s before starting the bridge, or remove it from agents.%s.env", kv, a.Name)})
		}
	}
	return out
}

func fixFor(a *agentconfig.Agent, p *hybrid.Error) string {
	switch p.Subject + "/" + p.Reason {
	case "interpreter/" + hybrid.ReasonNotInPath:
		return fmt.Sprintf("install %s, or set agents.%s.python to an interpreter's path (e.g. adk-env/bin/python, relative to the workspace)", a.Python, a.Name)
	case "interpreter/" + hybrid.ReasonMissing, "interpreter/" + hybrid.ReasonDirectory:
		return fmt.Sprintf("create the environment (python3 -m venv ...) or correct agents.%s.python (relative to the workspace)", a.Name)
	case "interpreter/" + hybrid.ReasonNotExecutable:
		return fmt.Sprintf("chmod +x %s", a.Run.Interpreter)
	case "script/" + hybrid.ReasonMissing, "script/" + hybrid.ReasonDirectory:
		return fmt.Sprintf("correct agents.%s.path (relative to the workspace %s) or create the script", a.Name, a.Run.Dir)
	case "script/" + hybrid.ReasonNotReadable:
		return fmt.Sprintf("chmod +r %s, and make sure the bridge's user can reach its directory", a.Run.Script)
	case "script/" + hybrid.ReasonNotExecutable:
		return fmt.Sprintf("chmod +x %s, or set agents.%s.python to its interpreter", a.Run.Script, a.Name)
	}
	return "check the path and its permissions"
}

// missingEnv lists the variables agent a asks for that the bridge does not
// have.
func missingEnv(a *agentconfig.Agent, cfg Settings) []string {
	var missing []string
	for _, n := range a.EnvNames {
		if _, ok := cfg.lookup(n); !ok {
			missing = append(missing, n)
		}
	}
	return missing
}

func isNotExist(err error) bool {
	for e := err; e != nil; {
		if os.IsNotExist(e) {
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}
