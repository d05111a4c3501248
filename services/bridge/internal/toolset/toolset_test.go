package toolset_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conclave-ai/conclave/services/bridge/internal/toolset"
)

func TestDiagnose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// The real interpreter behind python3: version managers put slow
	// shell shims on PATH.
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		t.Fatal(err)
	}
	py := strings.TrimSpace(string(out))
	for name, mode := range map[string]os.FileMode{"ok.py": 0o644, "plain": 0o644, "notpython": 0o644} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("print('{}')\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	body := `agents:
  good: {path: ok.py, python: ` + py + `}
  no_script: {path: gone.py, python: ` + py + `}
  no_interpreter: {path: ok.py, python: python3.99-nonexistent}
  venv_missing: {path: ok.py, python: venv/bin/python}
  not_executable: {path: plain, executable: true}
  interpreter_not_executable: {path: ok.py, python: ./notpython}
  wants_token: {path: ok.py, python: ` + py + `, env: [BRIDGE_TEST_UNSET_TOKEN]}
`
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	findings := toolset.Diagnose(toolset.Settings{ConfigFile: cfgPath, Env: func(string) (string, bool) { return "", false }})
	want := map[string]string{
		"agent good: ":                                   "",
		"agent no_script: script":                        "correct agents.no_script.path",
		"agent no_interpreter: interpreter python3.99":   "install python3.99-nonexistent, or set agents.no_interpreter.python",
		"agent venv_missing: interpreter":                "create the environment",
		"agent not_executable: script":                   "chmod +x",
		"agent interpreter_not_executable: interpreter":  "chmod +x",
		"agent wants_token: BRIDGE_TEST_UNSET_TOKEN is ": "export BRIDGE_TEST_UNSET_TOKEN",
	}
	for prefix, fix := range want {
		found := false
		for _, f := range findings {
			if strings.HasPrefix(f.What, prefix) {
				found = true
				if fix == "" && !f.OK || fix != "" && (f.OK || !strings.Contains(f.Fix, fix)) {
					t.Errorf("finding %+v, want fix containing %q", f, fix)
				}
			}
		}
		if !found {
			t.Errorf("no finding for %q in %+v", prefix, findings)
		}
	}
	h, err := toolset.CheckHealth(toolset.Settings{ConfigFile: cfgPath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.Healthy || !h.Agents["good"].Healthy || h.Agents["no_script"].Healthy || len(h.Agents["no_script"].Problems) != 1 {
		t.Fatalf("health = %+v", h)
	}

	bad := toolset.Diagnose(toolset.Settings{ConfigFile: filepath.Join(dir, "missing.yaml")})
	if len(bad) != 1 || bad[0].OK || !strings.Contains(bad[0].Fix, "CONCLAVE_BRIDGE_CONFIG") {
		t.Fatalf("missing config: %+v", bad)
	}
}
