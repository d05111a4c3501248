package hostlink

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/internal/acp"
)

const acceptTimeout = 30 * time.Second

// integration opens a test that starts agent-host and the example agent:
// skipped under -short, run in parallel with the other tests.
func integration(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts agent-host and the example agent")
	}
	t.Parallel()
}

// readyTimeout bounds the wait for agent-host to start, connect and open
// its agent's session.
const readyTimeout = time.Minute

// awaitReady waits up to readyTimeout for the launch's agent-host to
// connect and its agent's session to be up.
func awaitReady(t *testing.T, link *Link) Ready {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), readyTimeout)
	defer cancel()
	ready, err := link.Ready(ctx)
	if err != nil {
		t.Fatalf("waiting for agent-host to connect and its agent's session: %v", err)
	}
	return ready
}

// A prompt streams the agent's updates in order and ends its turn; a
// second prompt works; a prompt re-sent for a turn that ended is answered
// without the agent; Close ends the agent and agent-host with status 0.
// The agent sees none of agent-host's settings, and continues its trace.
func TestConversation(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	rec := newRecorder()
	link := rig.hub.Expect("inst-conv", 1, rec.options())
	ws := t.TempDir()
	const trace = "0af7651916cd43dd8448eb211c80319c"
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-conv", workspace: ws,
		env:   map[string]string{"TRACEPARENT": "00-" + trace + "-b7ad6b7169203331-01"},
		agent: []string{acpAgentBin, "-dialect", "acp", "-print-env"}})
	ctx := t.Context()

	ready, err := link.Ready(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ready.SessionID == "" || ready.Dialect != acp.DialectACP || !ready.LoadSession || ready.Loaded {
		t.Fatalf("ready = %+v", ready)
	}
	turn, err := link.PromptTurn(ctx, 1, "hello", acceptTimeout)
	if err != nil || turn.StopReason != acp.StopEndTurn {
		t.Fatalf("turn 1 = %+v, %v", turn, err)
	}
	// The permission the agent asked for, and the answer, cross the link
	// as updates too.
	want := []string{"content: Working on: hello", "plan: 1/2 completed: read the prompt [completed]; write notes.txt [in_progress]", "tool_call: ",
		"permission_request: options allow [allow_once], reject [reject_once]", "permission_outcome: selected allow [allow_once] (policy allow)",
		"tool_call_update: ", "content:  Done."}
	if got := rec.texts(); !slices.Equal(got, want) {
		t.Fatalf("updates = %q, want %q", got, want)
	}
	if !fileExists(ws, "notes.txt") {
		t.Fatal("the agent's fs/write_text_file did not reach the workspace")
	}
	turn, err = link.Prompt(ctx, "again", acceptTimeout)
	if err != nil || turn.StopReason != acp.StopEndTurn {
		t.Fatalf("turn 2 = %+v, %v", turn, err)
	}
	if n := len(rec.texts()); n != 2*len(want) {
		t.Fatalf("%d updates after two turns, want %d", n, 2*len(want))
	}
	// Idempotent by turn: turn 2 again is its result, not a third run.
	turn, err = link.PromptTurn(ctx, 2, "again", acceptTimeout)
	if err != nil || turn.StopReason != acp.StopEndTurn {
		t.Fatalf("turn 2 again = %+v, %v", turn, err)
	}

	if err := link.Close(); err != nil {
		t.Fatal(err)
	}
	awaitDone(t, link, "the closed link")
	if code := p.wait(t); code != 0 {
		t.Fatalf("agent-host exited %d", code)
	}
	if x := link.Exit(); x == nil || x.Code != 0 {
		t.Fatalf("exit = %+v", x)
	}
	if n := len(rec.texts()); n != 2*len(want) {
		t.Fatalf("%d updates in all, want %d", n, 2*len(want))
	}
	token := Token(testKey, "inst-conv")
	var env []string
	for _, l := range rec.allLogs() {
		if strings.Contains(l, token) {
			t.Errorf("the token reached the log: %q", l)
		}
		if v, ok := strings.CutPrefix(l, "stderr: acp-agent: env "); ok {
			env = append(env, v)
		}
	}
	if !slices.Contains(env, "SOMETHING_THE_AGENT_SHOULD_SEE=yes") {
		t.Fatalf("the agent's env lacks agent-host's other variables: %q", env)
	}
	sawTrace := false
	for _, kv := range env {
		if strings.HasPrefix(kv, EnvPrefix) {
			t.Errorf("the agent got %s", kv)
		}
		if strings.HasPrefix(kv, "TRACEPARENT=00-"+trace+"-") {
			sawTrace = true
		}
	}
	if !sawTrace {
		t.Errorf("the agent's TRACEPARENT does not continue trace %s: %q", trace, env)
	}
	if strings.Contains(p.stderr.String(), token) {
		t.Error("agent-host logged its token")
	}
}

// A cancel ends the turn in progress without ending the agent; a cancel
// before the prompt is sent keeps it from the agent.
func TestCancel(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	ws := t.TempDir()
	rec, link, p := launchHost(t, rig, hostSpec{instance: "inst-cancel", workspace: ws, agent: []string{acpAgentBin, "-mode", "slow-tool"}})
	ctx := t.Context()
	if _, err := link.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	for turn := int64(1); turn <= 2; turn++ {
		id := link.BeginTurn()
		type result struct {
			turn acp.Turn
			err  error
		}
		res := make(chan result, 1)
		go func() {
			tr, err := link.PromptTurn(ctx, turn, "slowly", acceptTimeout)
			res <- result{tr, err}
		}()
		tools := turn
		rec.waitFor(t, "the tool call", func(us []acp.Update, _ []string) bool {
			n := 0
			for _, u := range us {
				if u.Kind == acp.KindToolCall {
					n++
				}
			}
			return int64(n) == tools
		})
		if err := link.CancelTurn(ctx, "enough", id); err != nil {
			t.Fatal(err)
		}
		r := <-res
		if r.err != nil || r.turn.StopReason != acp.StopCancelled {
			t.Fatalf("turn %d = %+v, %v", turn, r.turn, r.err)
		}
	}
	before := len(rec.texts())
	id := link.BeginTurn()
	if err := link.CancelTurn(ctx, "never mind", id); err != nil {
		t.Fatal(err)
	}
	tr, err := link.PromptTurn(ctx, 3, "unsent", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopCancelled {
		t.Fatalf("turn 3 = %+v, %v", tr, err)
	}
	closeAndExit(t, link, p)
	if after := len(rec.texts()); after != before {
		t.Fatalf("the unsent turn reached the agent: %q", rec.texts()[before:])
	}
}

// A wrong token is refused (Unauthenticated) before the agent is started.
func TestWrongToken(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	rec := newRecorder()
	rig.hub.Expect("inst-token", 1, rec.options())
	ws := t.TempDir()
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-token", workspace: ws, token: Token([]byte("another key"), "inst-token"),
		agent: []string{"/bin/sh", "-c", "touch started; exec " + acpAgentBin}})
	if code := p.wait(t); code != ExitRefused {
		t.Fatalf("agent-host exited %d, want %d", code, ExitRefused)
	}
	if !strings.Contains(p.stderr.String(), "Unauthenticated") {
		t.Fatalf("agent-host's stderr does not say Unauthenticated:\n%s", p.stderr.String())
	}
	if fileExists(ws, "started") {
		t.Fatal("the agent was started")
	}
	if logs := rec.allLogs(); len(logs) > 0 {
		t.Fatalf("the link got logs: %q", logs)
	}
}

// An agent that crashes mid-turn fails the turn with acp.ErrAgentGone and
// ends the link with its exit code, which agent-host exits with too.
func TestCrash(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	_, link, p := launchHost(t, rig, hostSpec{instance: "inst-crash", workspace: t.TempDir(), agent: []string{acpAgentBin, "-mode", "crash"}})
	tr, err := link.PromptTurn(t.Context(), 1, "crash", acceptTimeout)
	if !errors.Is(err, acp.ErrAgentGone) || tr.StopReason != acp.StopError {
		t.Fatalf("turn = %+v, %v; want an error wrapping acp.ErrAgentGone", tr, err)
	}
	awaitDone(t, link, "the link of the agent that exited 3")
	if x := link.Exit(); x == nil || x.Code != 3 {
		t.Fatalf("exit = %+v, want code 3", x)
	}
	if code := p.wait(t); code != 3 {
		t.Fatalf("agent-host exited %d, want 3", code)
	}
}

// A dropped connection, several times mid-turn, loses and duplicates no
// update: agent-host re-sends what was not acknowledged, the hub drops
// what it already took.
func TestDroppedConnection(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	px := startProxy(t, rig.addr)
	rec := newRecorder()
	rec.onUpdate = func(u acp.Update) {
		switch u.Text {
		case "chunk 50", "chunk 120", "chunk 180":
			// Held until agent-host has reconnected, so that each drop
			// makes it re-send what follows.
			// This runs on the link's goroutine, where the test cannot
			// end: past the deadline it fails and lets the turn go on.
			before := px.connections()
			px.dropAll()
			for deadline := time.Now().Add(time.Minute); px.connections() == before; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Errorf("agent-host did not reconnect within a minute after the drop at %q", u.Text)
					return
				}
			}
		}
	}
	link := rig.hub.Expect("inst-drop", 1, rec.options())
	ws := t.TempDir()
	p := startHost(t, hostSpec{addr: px.addr, instance: "inst-drop", workspace: ws, agent: []string{acpAgentBin, "-mode", "gated", "-chunks", "200"}})
	if err := os.WriteFile(filepath.Join(ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := link.PromptTurn(t.Context(), 1, "stream", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", tr, err)
	}
	want := append([]string{"content: Working on: stream"}, chunks(200)...)
	if got := rec.texts(); !slices.Equal(got, want) {
		t.Fatalf("updates = %q\nwant %q", got, want)
	}
	if px.connections() < 4 {
		t.Fatalf("agent-host connected %d times, want at least 4 (3 drops)", px.connections())
	}
	closeAndExit(t, link, p)
}

// A runner restart mid-prompt: the runner stops while the agent streams;
// agent-host buffers; a new runner (a new hub, the same key and address)
// expects the same launch and re-sends the pending prompt by its turn; the
// buffered updates arrive, the turn ends once, nothing is duplicated.
func TestRunnerRestart(t *testing.T) {
	integration(t)
	rig1 := startHub(t, "")
	ws := t.TempDir()
	rec1, link1, p := launchHost(t, rig1, hostSpec{instance: "inst-restart", workspace: ws, agent: []string{acpAgentBin, "-mode", "gated", "-chunks", "300"}})
	ready1 := awaitReady(t, link1)
	go func() { _, _ = link1.PromptTurn(t.Context(), 1, "go", acceptTimeout) }()
	rec1.waitFor(t, "the turn's first update", hasUpdate("Working on: go"))
	rig1.stop()

	// The runner is gone: the agent streams its turn into agent-host's
	// buffer.
	if err := os.WriteFile(filepath.Join(ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the agent to stream its turn into agent-host's buffer", func() bool { return fileExists(ws, "streamed") })

	rig2 := startHub(t, rig1.addr)
	rec2 := newRecorder()
	link2 := rig2.hub.Expect("inst-restart", 1, rec2.options())
	tr, err := link2.PromptTurn(t.Context(), 1, "go", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", tr, err)
	}
	if ready2 := awaitReady(t, link2); ready2.SessionID != ready1.SessionID {
		t.Fatalf("ready after the restart = %+v; want session %s", ready2, ready1.SessionID)
	}
	if got := rec1.texts(); !slices.Equal(got, []string{"content: Working on: go"}) {
		t.Fatalf("the first runner took %q", got)
	}
	if got := rec2.texts(); !slices.Equal(got, chunks(300)) {
		t.Fatalf("the second runner took %d updates, want chunks 1-300 once each, in order: %q", len(got), got)
	}
	// The second prompt of turn 1 did not run it again.
	if n := strings.Count(strings.Join(rec2.allLogs(), "\n"), "started the agent"); n != 0 {
		t.Fatalf("the agent was started again")
	}
	closeAndExit(t, link2, p)
}

// A full buffer stops agent-host reading the agent's stdout: the agent
// blocks in its write, nothing is dropped, and everything arrives once the
// runner takes it again.
func TestBackpressure(t *testing.T) {
	integration(t)
	// Fixed flow-control windows, so that what gRPC buffers is small.
	rig := startHub(t, "", grpcWindows()...)
	rec := newRecorder()
	release := make(chan struct{})
	var once sync.Once
	rec.onUpdate = func(u acp.Update) {
		if u.Text == "chunk 1" {
			once.Do(func() { <-release })
		}
	}
	link := rig.hub.Expect("inst-full", 1, rec.options())
	ws := t.TempDir()
	const n = 20000 // about 4 MB, far over what the buffer, gRPC and the pipe hold
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-full", workspace: ws,
		env:   map[string]string{"CONCLAVE_AGENT_HOST_BUFFER_BYTES": "65536", "CONCLAVE_AGENT_HOST_HEARTBEAT": "1m"},
		agent: []string{acpAgentBin, "-mode", "gated", "-chunks", strconv.Itoa(n)}})
	if err := os.WriteFile(filepath.Join(ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	type result struct {
		turn acp.Turn
		err  error
	}
	res := make(chan result, 1)
	go func() {
		tr, err := link.PromptTurn(t.Context(), 1, "flood", acceptTimeout)
		res <- result{tr, err}
	}()
	testenv.Eventually(t, time.Minute, "the agent's pid file", func() bool { return fileExists(ws, "agent.pid") })
	raw, _ := os.ReadFile(filepath.Join(ws, "agent.pid"))
	pid, _ := strconv.Atoi(string(raw))
	// The agent is blocked writing its stdout, which nobody reads.
	testenv.Eventually(t, time.Minute, "the agent to block writing its stdout", func() bool { return blockedInPipeWrite(pid) })
	if fileExists(ws, "streamed") {
		t.Fatal("the agent streamed everything while the runner took nothing")
	}
	close(release)
	r := <-res
	if r.err != nil || r.turn.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", r.turn, r.err)
	}
	if got := onlyChunks(rec.texts()); !slices.Equal(got, chunks(n)) {
		t.Fatalf("took %d chunks, want %d once each, in order", len(got), n)
	}
	closeAndExit(t, link, p)
}

// blockedInPipeWrite reports whether a thread of pid sleeps in a pipe
// write (the agent is a Go program: any of its threads may be writing).
func blockedInPipeWrite(pid int) bool {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*")
	for _, task := range tasks {
		wchan, _ := os.ReadFile(filepath.Join(task, "wchan"))
		stat, _ := os.ReadFile(filepath.Join(task, "stat"))
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) > 0 && fields[0] == "S" && strings.Contains(string(wchan), "pipe_write") {
			return true
		}
	}
	return false
}

// A runner unreachable past the give-up time: agent-host kills the agent
// and exits 69.
func TestGiveUp(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	link := rig.hub.Expect("inst-giveup", 1, newRecorder().options())
	ws := t.TempDir()
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-giveup", workspace: ws,
		env:   map[string]string{"CONCLAVE_AGENT_HOST_GIVE_UP": "1s"},
		agent: []string{acpAgentBin, "-mode", "gated"}})
	go func() { _, _ = link.PromptTurn(t.Context(), 1, "wait", acceptTimeout) }()
	testenv.Eventually(t, time.Minute, "the agent's pid file", func() bool { return fileExists(ws, "agent.pid") })
	raw, _ := os.ReadFile(filepath.Join(ws, "agent.pid"))
	pid, _ := strconv.Atoi(string(raw))
	rig.stop()
	if code := p.wait(t); code != ExitUnavailable {
		t.Fatalf("agent-host exited %d, want %d", code, ExitUnavailable)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the agent (pid %d) outlived agent-host: %v", pid, err)
	}
	if !strings.Contains(p.stderr.String(), "giving up") {
		t.Fatalf("agent-host's stderr does not say it gave up:\n%s", p.stderr.String())
	}
}

// agent-host started before its launch is expected (a runner that has
// not claimed it yet) retries until it is.
func TestConnectBeforeExpect(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-early", workspace: t.TempDir(), launch: 2, agent: []string{acpAgentBin}})
	testenv.Eventually(t, time.Minute, "agent-host to be refused with NotFound", func() bool { return strings.Contains(p.stderr.String(), "NotFound") })
	rig.hub.Expect("inst-early", 1, LinkOptions{}).Close() // an older launch: still not this one
	link := rig.hub.Expect("inst-early", 2, newRecorder().options())
	awaitReady(t, link)
	// A newer launch supersedes it: its host is told to stop.
	rig.hub.Expect("inst-early", 3, LinkOptions{})
	if code := p.wait(t); code != ExitRefused {
		t.Fatalf("agent-host exited %d, want %d", code, ExitRefused)
	}
}

// The kandev dialect works through agent-host as it does locally: the
// agent accepts the prompt at once and ends the turn with a complete
// update.
func TestKandevDialect(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	rec, link, p := launchHost(t, rig, hostSpec{instance: "inst-kandev", workspace: t.TempDir(),
		env:   map[string]string{"CONCLAVE_AGENT_HOST_PROTOCOL": "kandev"},
		agent: []string{acpAgentBin, "-dialect", "kandev"}})
	if ready := awaitReady(t, link); ready.Dialect != acp.DialectKandev {
		t.Fatalf("ready = %+v", ready)
	}
	tr, err := link.PromptTurn(t.Context(), 1, "hi", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", tr, err)
	}
	rec.waitFor(t, "the complete update", func(us []acp.Update, _ []string) bool {
		return len(us) > 0 && us[len(us)-1].Kind == acp.KindComplete
	})
	closeAndExit(t, link, p)
}

// SIGTERM to agent-host (its pod deleted) ends the agent and reports how.
func TestSIGTERM(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	link := rig.hub.Expect("inst-term", 1, newRecorder().options())
	p := startHost(t, hostSpec{addr: rig.addr, instance: "inst-term", workspace: t.TempDir(), agent: []string{acpAgentBin, "-mode", "linger"}})
	awaitReady(t, link)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitDone(t, link, "the link of agent-host after SIGTERM")
	x := link.Exit()
	if x == nil || x.Signal != "terminated" {
		t.Fatalf("exit = %+v, want the agent terminated", x)
	}
	if code := p.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("agent-host exited %d, want %d", code, 128+int(syscall.SIGTERM))
	}
}

// A legacy agent's run is its turn: agent-host starts it when the turn is
// asked for, and its result line ends the turn.
func TestLegacyDialect(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	rec, link, p := launchHost(t, rig, hostSpec{instance: "inst-legacy", workspace: t.TempDir(),
		env:   map[string]string{"CONCLAVE_AGENT_HOST_PROTOCOL": "legacy"},
		agent: []string{acpAgentBin, "-dialect", "legacy"}})
	// Ready before the prompt, as with any agent: the supervisor waits for
	// it first.
	if ready := awaitReady(t, link); ready.Dialect != acp.DialectLegacy || ready.SessionID != "" {
		t.Fatalf("ready = %+v", ready)
	}
	tr, err := link.PromptTurn(t.Context(), 1, "run", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", tr, err)
	}
	var kinds []string
	for _, u := range rec.texts() {
		kinds = append(kinds, strings.SplitN(u, ":", 2)[0])
	}
	if want := []string{"status", "progress", "log", "heartbeat", "complete"}; !slices.Equal(kinds, want) {
		t.Fatalf("update kinds = %q, want %q", kinds, want)
	}
	awaitDone(t, link, "the link of the legacy agent, which exits after its run")
	if code := p.wait(t); code != 0 {
		t.Fatalf("agent-host exited %d", code)
	}
}

// A runner that recorded nothing of a turn that ended (it crashed after
// taking the turn's end) re-sends its prompt after a restart: agent-host
// answers with the turn's end again, and the agent does not run it twice.
func TestPromptAgainAfterRestart(t *testing.T) {
	integration(t)
	rig1 := startHub(t, "")
	_, link1, p := launchHost(t, rig1, hostSpec{instance: "inst-again", workspace: t.TempDir(), agent: []string{acpAgentBin}})
	tr, err := link1.PromptTurn(t.Context(), 1, "once", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", tr, err)
	}
	rig1.stop()

	rig2 := startHub(t, rig1.addr)
	rec2 := newRecorder()
	link2 := rig2.hub.Expect("inst-again", 1, rec2.options())
	tr, err = link2.PromptTurn(t.Context(), 1, "once", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn again = %+v, %v", tr, err)
	}
	// Turn 2 runs: the agent is alive and takes the next prompt.
	tr, err = link2.PromptTurn(t.Context(), 2, "twice", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn 2 = %+v, %v", tr, err)
	}
	for _, u := range rec2.texts() {
		if strings.Contains(u, "Working on: once") {
			t.Fatalf("turn 1 ran again: %q", rec2.texts())
		}
	}
	if !slices.Contains(rec2.texts(), "content: Working on: twice") {
		t.Fatalf("turn 2's updates are missing: %q", rec2.texts())
	}
	closeAndExit(t, link2, p)
}

// A detached link leaves the agent running: its host reconnects once the
// launch is expected again, and the turn it was in is answered, not run
// again, with every update once.
func TestDetach(t *testing.T) {
	integration(t)
	rig := startHub(t, "")
	ws := t.TempDir()
	rec1, link1, p := launchHost(t, rig, hostSpec{instance: "inst-detach", workspace: ws, agent: []string{acpAgentBin, "-mode", "gated", "-chunks", "50"}})
	awaitReady(t, link1)
	turn1 := make(chan error, 1)
	go func() {
		_, err := link1.PromptTurn(t.Context(), 1, "go", acceptTimeout)
		turn1 <- err
	}()
	rec1.waitFor(t, "the turn's first update", hasUpdate("Working on: go"))
	link1.Detach()
	if err := <-turn1; !errors.Is(err, acp.ErrAgentGone) {
		t.Fatalf("the detached link's turn ended with %v, want acp.ErrAgentGone", err)
	}
	select {
	case <-link1.Done():
	default:
		t.Fatal("a detached link is not Done")
	}

	if err := os.WriteFile(filepath.Join(ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rec2 := newRecorder()
	link2 := rig.hub.Expect("inst-detach", 1, rec2.options())
	tr, err := link2.PromptTurn(t.Context(), 1, "go", acceptTimeout)
	if err != nil || tr.StopReason != acp.StopEndTurn {
		t.Fatalf("turn = %+v, %v", tr, err)
	}
	if got := rec2.texts(); !slices.Equal(got, chunks(50)) {
		t.Fatalf("the link after the detach took %d updates, want chunks 1-50 once each, in order: %q", len(got), got)
	}
	closeAndExit(t, link2, p)
}

// agent-host applies the runner's rule on a launch's env again before it
// starts the agent (the Job's spec carries the env): a variable the launch
// set that hooks the agent's shell, or that the type does not allow, and
// the agent is never started; what is allowed reaches it.
func TestLaunchEnvCheckedAgain(t *testing.T) {
	integration(t)
	for _, tt := range []struct {
		name      string
		launchEnv string
		refused   string // the variable named, or "" for a started agent
	}{
		{"hook variable, whatever the type allows", "BASH_ENV,CALLER_GREETING", "BASH_ENV"},
		{"not allowed by the type", "CALLER_GREETING,OTHER", "OTHER"},
		{"allowed", "CALLER_GREETING", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ws := t.TempDir()
			marker := filepath.Join(ws, "hook-ran")
			hook := filepath.Join(ws, "hook.sh")
			if err := os.WriteFile(hook, []byte("touch "+marker+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			rig := startHub(t, "")
			instance := "inst-env-" + strconv.Itoa(len(tt.launchEnv))
			rec, link, p := launchHost(t, rig, hostSpec{instance: instance, workspace: ws,
				env: map[string]string{
					"CONCLAVE_AGENT_HOST_LAUNCH_ENV":         tt.launchEnv,
					"CONCLAVE_AGENT_HOST_LAUNCH_ENV_ALLOWED": "TASK_DESCRIPTION,B*,CALLER_*",
					"BASH_ENV":                               hook,
					"CALLER_GREETING":                        "hello",
					"OTHER":                                  "x",
				},
				agent: []string{"/bin/bash", "-c", `exec "$0" -print-env`, acpAgentBin}})
			if tt.refused == "" {
				if _, err := link.PromptTurn(t.Context(), 1, "hi", acceptTimeout); err != nil {
					t.Fatal(err)
				}
				rec.waitFor(t, "the agent's env", func(_ []acp.Update, logs []string) bool {
					return slices.Contains(logs, "stderr: acp-agent: env CALLER_GREETING=hello")
				})
				_ = link.Close()
				awaitDone(t, link, "the closed link")
				return
			}
			select {
			case <-link.Done():
			case <-time.After(30 * time.Second):
				t.Fatalf("agent-host still runs after 30s: it started the agent with %s", tt.refused)
			}
			if x := link.Exit(); x == nil || !strings.Contains(x.Reason, "refused to start the agent") || !strings.Contains(x.Reason, tt.refused) {
				t.Fatalf("exit = %+v, want the agent refused for %s", x, tt.refused)
			}
			if code := p.wait(t); code != ExitStartFailed {
				t.Errorf("agent-host exited %d, want %d", code, ExitStartFailed)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the agent was started: BASH_ENV's hook ran")
			}
		})
	}
}

// TestAuthenticate: agent-host authenticates with the type's auth method
// (CONCLAVE_AGENT_HOST_AUTH_METHOD) before session/new, when the agent
// offers it; without one, the agent's refusal of session/new ends the
// agent, saying it is the agent's error and which methods it offers.
func TestAuthenticate(t *testing.T) {
	integration(t)
	for _, tt := range []struct {
		name, method string
		up           bool
	}{
		{"the type names the method", "test-key", true},
		{"the type names none", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rig := startHub(t, "")
			instance := "inst-auth-" + strconv.FormatBool(tt.up)
			rec, link, _ := launchHost(t, rig, hostSpec{instance: instance, workspace: t.TempDir(),
				env:   map[string]string{"CONCLAVE_AGENT_HOST_AUTH_METHOD": tt.method},
				agent: []string{acpAgentBin, "-dialect", "acp", "-auth", "test-key"}})
			ready, err := link.Ready(t.Context())
			if tt.up {
				if err != nil || ready.SessionID == "" {
					t.Fatalf("ready = %+v, %v", ready, err)
				}
				rec.waitFor(t, "the log of authenticate", hasLog("authenticated with the agent's auth method test-key"))
				return
			}
			if err == nil {
				t.Fatalf("ready = %+v, want the session refused", ready)
			}
			rec.waitFor(t, "the log of the agent's error", hasLog("agent_error: session/new: the agent answered with an error: Authentication required: no API key is configured (code -32000); the agent offers authMethods test-key (Test key)"))
		})
	}
}

func hasLog(text string) func([]acp.Update, []string) bool {
	return func(_ []acp.Update, logs []string) bool {
		return slices.ContainsFunc(logs, func(l string) bool { return strings.Contains(l, text) })
	}
}
