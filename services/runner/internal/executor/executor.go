// Package executor starts agent processes: a local process group (Local,
// the default), whose stdio the runner speaks ACP over, or a Kubernetes Job
// (Kubernetes), whose entrypoint agent-host speaks ACP to the agent where it
// runs and dials back to the runner.
package executor

import (
	"context"
	"io"

	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
)

// Spec is one instance to start.
type Spec struct {
	InstanceID string
	TaskID     string
	Type       agenttype.Type
	// Workspace is the instance's workspace, already confined to the
	// allowed roots.
	Workspace string
	// Env is the whole environment the agent gets: the type's declared env,
	// the launch's env and TRACEPARENT. Nothing of the runner's own leaks.
	Env map[string]string
	// Launch is the instance's launch number: a Job is per launch.
	Launch int64
	// Host configures agent-host, for an executor that runs the agent
	// behind it; others ignore it.
	Host HostSpec
}

// HostSpec is what agent-host needs to run an agent and reach the runner:
// its CONCLAVE_AGENT_HOST_* settings, and the instance's token, which is a
// secret (it goes in a Secret, never in a spec).
type HostSpec struct {
	Env   map[string]string
	Token string
}

// Process is a started agent.
type Process interface {
	// ID is the executor's handle, reported as the instance's
	// container_id: a process ID, or a Job name.
	ID() string
	// Kill ends the agent and everything it started (its process group, or
	// its Pod). It is safe to call more than once, and after exit.
	Kill() error
	// Wait returns once the agent has exited and its stderr is drained,
	// with its exit error.
	Wait() error
}

// StdioProcess is a Process the runner speaks ACP to over its stdio.
type StdioProcess interface {
	Process
	Stdin() io.WriteCloser
	Stdout() io.ReadCloser
}

var _ StdioProcess = (*localProcess)(nil)

// Executor starts agents. stderr receives the agent's stderr.
type Executor interface {
	Name() string
	Start(ctx context.Context, spec Spec, stderr io.Writer) (Process, error)
}
