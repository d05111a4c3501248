package hybrid

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults for an Agent's zero fields.
const (
	DefaultTimeout   = 300 * time.Second
	DefaultMaxStdout = 10 << 20
	// maxStderrLine and maxStderrBytes bound what one call can put into the
	// log: a line is cut at maxStderrLine bytes, and after maxStderrBytes the
	// rest of stderr is read and dropped.
	maxStderrLine  = 8 << 10
	maxStderrBytes = 1 << 20
	// pipeGrace is how long, once the agent has exited and its process group
	// been killed, its pipes are still read. Only a process that left the
	// group (setsid) can hold them open longer, and what it writes then is
	// not part of the response.
	pipeGrace = 200 * time.Millisecond
)

// Agent is one hybrid-protocol agent, resolved: absolute paths, the complete
// environment, the flag mapping.
type Agent struct {
	// Name identifies the agent in errors.
	Name string
	// Interpreter runs Script (say a Python); empty runs Script itself,
	// which must then be executable.
	Interpreter string
	Script      string
	// Dir is the working directory (the workspace root).
	Dir string
	// Env is the agent's whole environment; nothing else is inherited.
	Env   []string
	Flags []Flag
	// Timeout bounds the run; when it passes the process group is killed.
	Timeout time.Duration
	// MaxStdout is the most stdout read; more is an error.
	MaxStdout int64
	// ValidateInputs applies Validate with MaxParamLength before running.
	ValidateInputs bool
	MaxParamLength int
	// Stderr receives the agent's stderr, line by line (the bridge logs it).
	Stderr func(line string)
}

// Check reports whether the agent can be started: the workspace is a
// directory, the interpreter exists and is executable, the script exists, is
// a regular file and is readable (and executable when there is no
// interpreter). The error, of KindNotFound, says which and why.
func (a *Agent) Check() error {
	if p := a.Problems(); len(p) > 0 {
		return p[0]
	}
	return nil
}

// Problems is every reason the agent cannot be started, for health checks
// and diagnosis; Check returns the first.
func (a *Agent) Problems() []*Error {
	var problems []*Error
	if a.Dir != "" {
		if fi, err := os.Stat(a.Dir); err != nil || !fi.IsDir() {
			problems = append(problems, &Error{Kind: KindNotFound, Subject: SubjectWorkspace, Reason: ReasonMissing, ExitCode: -1,
				Message: fmt.Sprintf("workspace %s is not an accessible directory", a.Dir)})
		}
	}
	if a.Interpreter != "" {
		if err := checkFile(a.Interpreter, SubjectInterpreter, true); err != nil {
			problems = append(problems, err)
		}
	}
	if err := checkFile(a.Script, SubjectScript, a.Interpreter == ""); err != nil {
		problems = append(problems, err)
	}
	return problems
}

// What a KindNotFound Error is about (Error.Subject) and why (Error.Reason).
const (
	SubjectWorkspace   = "workspace"
	SubjectInterpreter = "interpreter"
	SubjectScript      = "script"

	ReasonMissing       = "missing"
	ReasonNotInPath     = "not_in_path"
	ReasonDirectory     = "directory"
	ReasonNotExecutable = "not_executable"
	ReasonNotReadable   = "not_readable"
)

func checkFile(path, what string, executable bool) *Error {
	notFound := func(reason, format string, args ...any) *Error {
		return &Error{Kind: KindNotFound, Subject: what, Reason: reason, ExitCode: -1, Message: fmt.Sprintf(what+" "+format, args...)}
	}
	if !strings.ContainsRune(path, '/') {
		return notFound(ReasonNotInPath, "%s was not found in PATH", path)
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notFound(ReasonMissing, "%s does not exist", path)
	case err != nil:
		return notFound(ReasonNotReadable, "%s cannot be examined: %v", path, err)
	case fi.IsDir():
		return notFound(ReasonDirectory, "%s is a directory", path)
	case executable && syscall.Access(path, 0x1) != nil:
		return notFound(ReasonNotExecutable, "%s is not executable (chmod +x %s)", path, path)
	case !executable && syscall.Access(path, 0x4) != nil:
		return notFound(ReasonNotReadable, "%s is not readable (chmod +r %s)", path, path)
	}
	return nil
}

// Run runs the agent once with params: validation (when enabled), the
// argument vector, the parameters as JSON on stdin, then the exit code and
// the single JSON object on stdout. It returns the agent's Response, which
// may itself have status "error" (an agent-side error), or an *Error for
// every bridge-side failure. The agent runs in its own process group, which
// is killed on timeout, on ctx's end, when stdout passes MaxStdout, and when
// the agent exits, so that no grandchild outlives the call.
func Run(ctx context.Context, a *Agent, params map[string]any) (*Response, error) {
	if params == nil {
		params = map[string]any{}
	}
	if a.ValidateInputs {
		if err := Validate(params, a.MaxParamLength); err != nil {
			return nil, err
		}
	}
	args, err := Argv(a.Flags, params)
	if err != nil {
		return nil, err
	}
	input, err := json.Marshal(params)
	if err != nil {
		return nil, validationError(RuleParams, fmt.Sprintf("parameters cannot be encoded as JSON: %v", err))
	}
	if err := a.Check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, &Error{Kind: KindCancelled, Message: "the call was cancelled before the agent started", ExitCode: -1}
	}
	return a.exec(ctx, args, input)
}

type pipes struct{ stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW *os.File }

func openPipes() (*pipes, error) {
	var p pipes
	var err error
	if p.stdinR, p.stdinW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if p.stdoutR, p.stdoutW, err = os.Pipe(); err != nil {
		p.closeAll()
		return nil, err
	}
	if p.stderrR, p.stderrW, err = os.Pipe(); err != nil {
		p.closeAll()
		return nil, err
	}
	return &p, nil
}

func (p *pipes) closeChildEnds() {
	for _, f := range []*os.File{p.stdinR, p.stdoutW, p.stderrW} {
		if f != nil {
			f.Close()
		}
	}
}

func (p *pipes) closeAll() {
	p.closeChildEnds()
	for _, f := range []*os.File{p.stdinW, p.stdoutR, p.stderrR} {
		if f != nil {
			f.Close()
		}
	}
}

func (a *Agent) exec(ctx context.Context, args []string, input []byte) (*Response, error) {
	path, argv := a.Script, []string{a.Script}
	if a.Interpreter != "" {
		path, argv = a.Interpreter, []string{a.Interpreter, a.Script}
	}
	argv = append(argv, args...)
	p, err := openPipes()
	if err != nil {
		return nil, &Error{Kind: KindExecution, Message: fmt.Sprintf("cannot create pipes for %s: %v", a.Name, err), ExitCode: -1}
	}
	// The pipes are *os.File, so exec starts no copying goroutines and Wait
	// returns as soon as the agent exits, whoever still holds the pipes.
	cmd := &exec.Cmd{
		Path: path, Args: argv, Dir: a.Dir, Env: a.Env,
		Stdin: p.stdinR, Stdout: p.stdoutW, Stderr: p.stderrW,
		// Its own group, so that it and its children are killed together;
		// and killed if the bridge dies first, so that a crashed bridge
		// leaves no agent running unsupervised (its children still get the
		// group kill only from a live bridge).
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	startErr := cmd.Start()
	p.closeChildEnds()
	if startErr != nil {
		p.stdinW.Close()
		p.stdoutR.Close()
		p.stderrR.Close()
		kind := KindExecution
		if errors.Is(startErr, fs.ErrNotExist) || errors.Is(startErr, fs.ErrPermission) || errors.Is(startErr, syscall.ENOEXEC) {
			kind = KindNotFound
		}
		return nil, &Error{Kind: kind, Message: fmt.Sprintf("cannot start %s: %v", a.Name, startErr), ExitCode: -1}
	}
	pgid := cmd.Process.Pid
	killGroup := func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) }

	go func() {
		// An agent that reads only its arguments never reads stdin; the
		// write then fails with EPIPE once it exits, which is fine.
		_, _ = p.stdinW.Write(input)
		p.stdinW.Close()
	}()
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		forwardLines(p.stderrR, a.Stderr)
	}()
	maxStdout := a.MaxStdout
	if maxStdout <= 0 {
		maxStdout = DefaultMaxStdout
	}
	var tooLarge atomic.Bool
	var stdout bytes.Buffer
	stdoutDone := make(chan struct{})
	go func() {
		defer close(stdoutDone)
		n, _ := io.Copy(&stdout, io.LimitReader(p.stdoutR, maxStdout+1))
		if n > maxStdout {
			tooLarge.Store(true)
			killGroup()
			_, _ = io.Copy(io.Discard, p.stdoutR)
		}
	}()

	timeout := a.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var timedOut, cancelled atomic.Bool
	exited := make(chan struct{})
	go func() {
		select {
		case <-exited:
		case <-timer.C:
			timedOut.Store(true)
			killGroup()
		case <-ctx.Done():
			cancelled.Store(true)
			killGroup()
		}
	}()
	waitErr := cmd.Wait()
	close(exited)
	killGroup() // grandchildren must not outlive the call
	deadline := time.Now().Add(pipeGrace)
	_ = p.stdoutR.SetReadDeadline(deadline)
	_ = p.stderrR.SetReadDeadline(deadline)
	_ = p.stdinW.SetWriteDeadline(deadline)
	<-stdoutDone
	<-stderrDone
	p.stdoutR.Close()
	p.stderrR.Close()

	exitCode := cmd.ProcessState.ExitCode()
	switch {
	case tooLarge.Load():
		return nil, &Error{Kind: KindOutputTooLarge, ExitCode: exitCode,
			Message: fmt.Sprintf("%s wrote more than %d bytes to stdout; the output was cut off and the agent stopped", a.Name, maxStdout)}
	case timedOut.Load():
		return nil, &Error{Kind: KindTimeout, ExitCode: exitCode,
			Message: fmt.Sprintf("%s did not finish within its timeout of %s; its process group was killed (raise timeout in config.yaml if it needs longer)", a.Name, timeout)}
	case cancelled.Load():
		return nil, &Error{Kind: KindCancelled, ExitCode: exitCode,
			Message: fmt.Sprintf("the call was cancelled; %s's process group was killed", a.Name)}
	}
	if waitErr != nil {
		e := &Error{Kind: KindExecution, ExitCode: exitCode}
		if status, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			e.Message = fmt.Sprintf("%s was killed by signal %s", a.Name, status.Signal())
		} else {
			e.Message = fmt.Sprintf("%s exited with code %d", a.Name, exitCode)
		}
		if r, err := ParseOutput(stdout.Bytes()); err == nil && r.Status == StatusError {
			e.Message += ": " + r.Error
			if len(r.Details) > 0 {
				e.Details = detailsText(r.Details)
			}
		} else if out := bytes.TrimSpace(stdout.Bytes()); len(out) > 0 {
			e.Details = excerpt(out)
		}
		return nil, e
	}
	return ParseOutput(stdout.Bytes())
}

// detailsText renders an agent's "details" value: a string as is, anything
// else as JSON.
func detailsText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// forwardLines hands r's lines to sink, each cut at maxStderrLine bytes,
// until maxStderrBytes have been forwarded; the rest is read and dropped so
// that the agent never blocks on a full pipe.
func forwardLines(r io.Reader, sink func(string)) {
	if sink == nil {
		_, _ = io.Copy(io.Discard, r)
		return
	}
	br := bufio.NewReaderSize(r, maxStderrLine)
	forwarded := 0
	for forwarded < maxStderrBytes {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			forwarded += len(line)
			truncated := errors.Is(err, bufio.ErrBufferFull)
			text := string(bytes.TrimRight(line, "\r\n"))
			if truncated {
				text += " [line cut]"
				// Skip the rest of the long line.
				for errors.Is(err, bufio.ErrBufferFull) {
					_, err = br.ReadSlice('\n')
				}
			}
			sink(text)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
	sink(fmt.Sprintf("[stderr beyond %d bytes dropped]", maxStderrBytes))
	_, _ = io.Copy(io.Discard, br)
}
