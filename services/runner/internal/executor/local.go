package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

// Local runs agents as child processes of the runner, each in its own
// process group so that a kill reaches everything the agent started, and
// each killed if the runner dies first.
type Local struct {
	// Roots are the directories workspaces must lie within.
	Roots []string
	// Records, when set, records every agent started, so that a runner
	// restarted after a crash ends what this one left running.
	Records *ProcessRecords
}

// Name is "local".
func (*Local) Name() string { return "local" }

// ErrWorkspace is wrapped by every refusal of a workspace.
var ErrWorkspace = errors.New("workspace refused")

// ConfineWorkspace checks path against the allowed roots: absolute, no ".."
// element, an existing directory, and within a root once symbolic links are
// resolved. It returns the resolved directory.
func ConfineWorkspace(roots []string, path string) (string, error) {
	switch {
	case path == "":
		return "", fmt.Errorf("%w: workspace_path is required", ErrWorkspace)
	case !filepath.IsAbs(path):
		return "", fmt.Errorf("%w: workspace_path %q must be absolute", ErrWorkspace, path)
	case hasDotDot(path):
		return "", fmt.Errorf("%w: workspace_path %q must not contain a \"..\" element", ErrWorkspace, path)
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("%w: workspace_path %q: %w", ErrWorkspace, path, err)
	}
	info, err := os.Stat(resolved)
	if err != nil || !info.IsDir() {
		return "", fmt.Errorf("%w: workspace_path %q is not a directory", ErrWorkspace, path)
	}
	for _, root := range roots {
		realRoot, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if acp.Within(realRoot, resolved) {
			return resolved, nil
		}
	}
	return "", fmt.Errorf("%w: workspace_path %q is outside the allowed roots (CONCLAVE_RUNNER_WORKSPACE_ROOTS)", ErrWorkspace, path)
}

// ConfineWorkspaceName is ConfineWorkspace for a workspace that is not on
// the runner's filesystem (a Kubernetes agent's throwaway emptyDir): the
// same rules on the path's text, which need not exist.
func ConfineWorkspaceName(roots []string, path string) (string, error) {
	switch {
	case path == "":
		return "", fmt.Errorf("%w: workspace_path is required", ErrWorkspace)
	case !filepath.IsAbs(path):
		return "", fmt.Errorf("%w: workspace_path %q must be absolute", ErrWorkspace, path)
	case hasDotDot(path):
		return "", fmt.Errorf("%w: workspace_path %q must not contain a \"..\" element", ErrWorkspace, path)
	}
	clean := filepath.Clean(path)
	for _, root := range roots {
		if acp.Within(filepath.Clean(root), clean) {
			return clean, nil
		}
	}
	return "", fmt.Errorf("%w: workspace_path %q is outside the allowed roots (CONCLAVE_RUNNER_WORKSPACE_ROOTS)", ErrWorkspace, path)
}

func hasDotDot(path string) bool {
	for _, el := range strings.Split(filepath.ToSlash(path), "/") {
		if el == ".." {
			return true
		}
	}
	return false
}

// Start runs spec.Type.Command in spec.Workspace with exactly spec.Env. The
// command is looked up on the runner's PATH, since the agent gets none of
// the runner's environment.
func (l *Local) Start(_ context.Context, spec Spec, stderr io.Writer) (Process, error) {
	if len(spec.Type.Command) == 0 {
		return nil, fmt.Errorf("agent type %s has no command for the local executor", spec.Type.ID)
	}
	// The API refused such a launch; one stored before that rule, or whose
	// type has changed since, is refused here.
	if err := spec.Type.CheckAgentEnv(spec.Env); err != nil {
		return nil, err
	}
	bin, err := exec.LookPath(spec.Type.Command[0])
	if err != nil {
		return nil, fmt.Errorf("agent type %s: %w", spec.Type.ID, err)
	}
	// Not exec.CommandContext: the process outlives the request that
	// started it, and ends by Kill.
	cmd := exec.Command(bin, spec.Type.Command[1:]...)
	cmd.Dir = spec.Workspace
	cmd.Env = envList(spec.Env)
	cmd.Stderr = stderr
	// Its own group, so that a kill reaches what it starts; killed if the
	// runner dies (forked from the starter thread, which only ends with
	// the runner).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A descendant that left the process group (setsid) may hold the stderr
	// pipe open after the agent exits: Wait stops waiting for it then.
	cmd.WaitDelay = exitDrain
	// Our own pipes rather than cmd.StdoutPipe, which Wait closes as soon
	// as the process exits, losing output not yet read.
	childIn, stdin, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	stdout, childOut, err := os.Pipe()
	if err != nil {
		childIn.Close()
		stdin.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout = childIn, childOut
	err = startOnStarterThread(cmd)
	childIn.Close()
	childOut.Close()
	if err != nil {
		stdin.Close()
		stdout.Close()
		return nil, fmt.Errorf("starting %s: %w", spec.Type.ID, err)
	}
	if l.Records != nil {
		l.Records.add(cmd.Process.Pid)
	}
	p := &localProcess{cmd: cmd, stdin: stdin, stdout: stdout, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		// What the agent left running in its group ends with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if l.Records != nil {
			l.Records.remove(cmd.Process.Pid)
		}
		// And a descendant outside the group that holds stdout open must not
		// keep the runner reading: what the agent wrote before it exited is
		// read within exitDrain, then reads end.
		_ = stdout.SetReadDeadline(time.Now().Add(exitDrain))
		close(p.done)
	}()
	return p, nil
}

// exitDrain is how long after an agent exits its pipes are still read.
const exitDrain = 2 * time.Second

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

type localProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	done   chan struct{}
	err    error
}

func (p *localProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *localProcess) Stdout() io.ReadCloser { return p.stdout }
func (p *localProcess) ID() string            { return strconv.Itoa(p.cmd.Process.Pid) }

// Kill sends SIGKILL to the whole process group.
func (p *localProcess) Kill() error {
	select {
	case <-p.done:
		// The group may outlive its leader: children it left behind.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return nil
	default:
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing process group %d: %w", p.cmd.Process.Pid, err)
	}
	return nil
}

func (p *localProcess) Wait() error {
	<-p.done
	return p.err
}
