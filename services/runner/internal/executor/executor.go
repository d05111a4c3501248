// Package executor starts agent processes. The runner drives an agent only
// through its stdio, so an executor is anything that can start one with a
// pipe to its stdin and from its stdout: a local process group (Local, the
// default) or, in issue 10, a Kubernetes Job attached to.
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
}

// Process is a started agent.
type Process interface {
	// Stdin and Stdout carry the protocol.
	Stdin() io.WriteCloser
	Stdout() io.ReadCloser
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

// Executor starts agents. stderr receives the agent's stderr.
type Executor interface {
	Name() string
	Start(ctx context.Context, spec Spec, stderr io.Writer) (Process, error)
}
