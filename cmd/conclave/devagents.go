package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// exampleAgentBinary is the example ACP agent's file name beside the
// conclave binary: `make build` builds both into bin/.
const exampleAgentBinary = "acp-agent"

// exampleAgentTypes gives conclave dev's runner an agent type that runs
// out of the box: example-agent, the repository's example ACP agent
// (examples/acp-agent), when its binary lies beside this one. It writes
// the type to agent-types.yaml in dataDir and returns that file's path; it
// returns "" when there is no such binary. The runner's built-in type,
// augment-agent, needs the Auggie CLI, which a fresh machine lacks.
func exampleAgentTypes(dataDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil
	}
	agent := filepath.Join(filepath.Dir(self), exampleAgentBinary)
	if _, err := os.Stat(agent); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dataDir, "agent-types.yaml")
	// strconv.Quote gives a YAML double-quoted string for any path.
	yaml := fmt.Sprintf(`# Written by conclave dev at each start: the example agent beside it.
# Give CONCLAVE_RUNNER_AGENT_TYPES your own file to run other agents.
agent_types:
  - id: example-agent
    name: Example ACP agent
    description: Conclave's example agent (examples/acp-agent). A turn streams a reply, asks permission, and writes notes.txt in its workspace.
    command: [%s, -dialect, acp]
    protocol: acp
    permission: allow
    capabilities: [chat, write_files]
`, strconv.Quote(agent))
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return "", err
	}
	return path, nil
}
