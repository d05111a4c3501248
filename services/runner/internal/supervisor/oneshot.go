package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/conclave-ai/conclave/pkg/hybrid"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
	"github.com/conclave-ai/conclave/services/runner/internal/agenttype"
	"github.com/conclave-ai/conclave/services/runner/internal/records"
)

// conversation is what a session runs turns through: an ACP client over a
// long-lived agent process, or a oneshot agent run once per turn.
type conversation interface {
	// BeginTurn starts a turn with no I/O, so that a cancel applies to it
	// before its prompt is sent; AbandonTurn ends one whose prompt will not
	// be sent.
	BeginTurn() uint64
	AbandonTurn()
	Prompt(ctx context.Context, message string, acceptTimeout time.Duration) (acp.Turn, error)
	// CancelTurn cancels turn id, as BeginTurn numbered it, if it is still
	// the turn in progress.
	CancelTurn(ctx context.Context, reason string, id uint64) error
	// Done is closed when the agent is gone.
	Done() <-chan struct{}
}

var (
	_ conversation = (*acp.Client)(nil)
	_ conversation = (*oneshot)(nil)
)

// oneshot runs a hybrid-protocol agent (the ADK bridge's, pkg/hybrid) once per
// turn: the prompt is its parameters as JSON, its one JSON object on stdout
// becomes one update, and cancelling kills its process group.
type oneshot struct {
	agent    hybrid.Agent
	onUpdate func(context.Context, acp.Update)

	mu    sync.Mutex
	turn  *oneshotTurn
	turns uint64
	done  chan struct{}
	once  sync.Once
}

type oneshotTurn struct {
	id        uint64
	cancelled bool
	// stop ends the run, once it has started.
	stop context.CancelFunc
}

func newOneshot(agent hybrid.Agent, onUpdate func(context.Context, acp.Update)) *oneshot {
	return &oneshot{agent: agent, onUpdate: onUpdate, done: make(chan struct{})}
}

func (o *oneshot) BeginTurn() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.turn == nil {
		o.turns++
		o.turn = &oneshotTurn{id: o.turns}
	}
	return o.turn.id
}

func (o *oneshot) AbandonTurn() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.turn != nil && o.turn.stop == nil {
		o.turn = nil
	}
}

func (o *oneshot) Done() <-chan struct{} { return o.done }

// Close ends the run in progress, if any, and the conversation.
func (o *oneshot) Close() {
	o.once.Do(func() { close(o.done) })
	o.mu.Lock()
	t := o.turn
	o.mu.Unlock()
	if t != nil && t.stop != nil {
		t.stop()
	}
}

func (o *oneshot) CancelTurn(_ context.Context, _ string, id uint64) error {
	o.mu.Lock()
	t := o.turn
	if t == nil || t.id != id {
		o.mu.Unlock()
		return nil
	}
	if t.stop == nil {
		t.cancelled = true
		o.mu.Unlock()
		return nil
	}
	o.mu.Unlock()
	t.stop()
	return nil
}

// maxUpdateText bounds the text of a oneshot result's log line; the event
// carries the whole object.
const maxUpdateText = 2000

func (o *oneshot) Prompt(ctx context.Context, message string, _ time.Duration) (acp.Turn, error) {
	o.BeginTurn()
	o.mu.Lock()
	t := o.turn
	if t.cancelled {
		o.turn = nil
		o.mu.Unlock()
		return acp.Turn{StopReason: acp.StopCancelled}, nil
	}
	select {
	case <-o.done:
		o.turn = nil
		o.mu.Unlock()
		return acp.Turn{StopReason: acp.StopError, Message: "the agent is stopping"}, fmt.Errorf("oneshot: %w", acp.ErrAgentGone)
	default:
	}
	runCtx, stop := context.WithCancel(ctx)
	t.stop = stop
	o.mu.Unlock()
	defer func() {
		stop()
		o.mu.Lock()
		if o.turn == t {
			o.turn = nil
		}
		o.mu.Unlock()
	}()
	params, err := oneshotParams(message)
	if err != nil {
		return acp.Turn{StopReason: acp.StopError, Message: err.Error()}, nil
	}
	resp, err := hybrid.Run(runCtx, &o.agent, params)
	if err != nil {
		var herr *hybrid.Error
		if errors.As(err, &herr) && herr.Kind == hybrid.KindCancelled {
			return acp.Turn{StopReason: acp.StopCancelled}, nil
		}
		u := acp.Update{Kind: acp.KindError, Text: err.Error(), Progress: -1}
		if herr != nil {
			u.Raw = herr.Response()
		}
		o.onUpdate(ctx, u)
		return acp.Turn{StopReason: acp.StopError, Message: err.Error()}, nil
	}
	u := acp.Update{Kind: acp.KindComplete, Success: resp.Status == hybrid.StatusSuccess, Progress: -1, Raw: resp.Object}
	text := resp.Error
	if u.Success {
		u.Progress = 100
		text = string(firstNonEmptyRaw(resp.Result, resp.Data))
	}
	if len(text) > maxUpdateText {
		text = text[:maxUpdateText]
		for !utf8.ValidString(text) {
			text = text[:len(text)-1]
		}
		text += "…"
	}
	u.Text = text
	o.onUpdate(ctx, u)
	if !u.Success {
		return acp.Turn{StopReason: acp.StopError, Message: "the agent answered an error: " + resp.Error}, nil
	}
	return acp.Turn{StopReason: acp.StopEndTurn}, nil
}

func firstNonEmptyRaw(rs ...json.RawMessage) json.RawMessage {
	for _, r := range rs {
		if len(r) > 0 {
			return r
		}
	}
	return nil
}

// oneshotParams is a prompt as a oneshot agent's parameters: a JSON object
// is taken as they are; any other text is {"prompt": text}, so that a
// launch's free-text TASK_DESCRIPTION reaches the agent too.
func oneshotParams(message string) (map[string]any, error) {
	var params map[string]any
	dec := json.NewDecoder(strings.NewReader(message))
	dec.UseNumber()
	if err := dec.Decode(&params); err == nil && params != nil && !dec.More() {
		return params, nil
	}
	return map[string]any{"prompt": message}, nil
}

// oneshotAgent resolves a oneshot agent type: command is [script] or
// [interpreter, script]; a bare interpreter name is looked up on the
// runner's PATH, and a relative script is taken from the workspace.
func oneshotAgent(typ agenttype.Type, workspace string, env map[string]string, stderr func(string)) (hybrid.Agent, error) {
	a := hybrid.Agent{
		Name: typ.ID, Dir: workspace, Timeout: typ.EffectiveTimeout(), MaxStdout: typ.MaxStdoutBytes,
		Flags: hybrid.SortedFlags(typ.Args), Stderr: stderr,
	}
	a.ValidateInputs, a.MaxParamLength = typ.OneshotValidation()
	// The API refused such a launch; one stored before that rule, or whose
	// type has changed since, is refused here.
	if err := typ.CheckAgentEnv(env); err != nil {
		return a, err
	}
	cmd := typ.Command
	switch len(cmd) {
	case 1:
		a.Script = cmd[0]
	case 2:
		a.Interpreter, a.Script = cmd[0], cmd[1]
		if filepath.Base(a.Interpreter) == a.Interpreter {
			path, err := exec.LookPath(a.Interpreter)
			if err != nil {
				return a, fmt.Errorf("agent type %s: interpreter %s: %w", typ.ID, a.Interpreter, err)
			}
			a.Interpreter = path
		}
	default:
		return a, fmt.Errorf("agent type %s: a oneshot command is [script] or [interpreter, script], got %d elements", typ.ID, len(cmd))
	}
	if !filepath.IsAbs(a.Script) {
		a.Script = filepath.Join(workspace, a.Script)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		a.Env = append(a.Env, k+"="+env[k])
	}
	return a, nil
}

// runOneshot runs a oneshot launch: no long-lived process, a run per turn.
func (ss *session) runOneshot(ctx context.Context, typ agenttype.Type, env map[string]string) error {
	agent, err := oneshotAgent(typ, ss.launch.Workspace, env, func(line string) { ss.log.Add(StreamStderr, line) })
	if err != nil {
		return ss.fail(ctx, "start_failed", err.Error())
	}
	// A oneshot agent runs here, in the runner's own container, even on
	// the Kubernetes executor, whose workspace_path is only a name under
	// the workspace root (an agent's Job gets an emptyDir): the directory
	// is made here, as the Job's would be. On the local executor it was
	// checked to exist at launch, and this changes nothing.
	if err := os.MkdirAll(ss.launch.Workspace, 0o750); err != nil {
		return ss.fail(ctx, "start_failed", fmt.Sprintf("workspace %s: %v", ss.launch.Workspace, err))
	}
	conv := newOneshot(agent, ss.onUpdate)
	ss.mu.Lock()
	ss.halt = conv.Close
	killed := ss.killed != ""
	ss.mu.Unlock()
	if killed {
		conv.Close()
	}
	ss.log.Add(StreamRunner, fmt.Sprintf("started %s as oneshot, a process per prompt (launch %d)", typ.ID, ss.seq))
	sessionUp := func(in *records.Instance) {
		in.Status, in.Dialect, in.ContainerID = records.StatusRunning, agenttype.ProtocolOneshot, agenttype.ProtocolOneshot
	}
	outcome, reason := ss.converse(ctx, conv, sessionUp, false)
	ss.mu.Lock()
	ss.ending = true
	ss.mu.Unlock()
	conv.Close()
	kind, why := ss.killedWhy()
	return ss.end(ctx, nil, outcome, reason, nil, kind, why)
}
