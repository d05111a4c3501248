package service_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/console/internal/session"
	"github.com/conclave-ai/conclave/services/console/service"
)

// These tests drive the console in headless Chromium against a real
// `conclave dev` (built from this checkout and started once, on free
// loopback ports), with the example coven agent connected to its gateway
// and the example ACP agent as a runner agent type.
var dev struct {
	addrs      map[string]string     // "console HTTP", "gateway gRPC", ...
	console    string                // http://127.0.0.1:port
	conclave   string                // the binary
	covenAgent string                // the binary
	workspace  string                // under the runner's workspace roots
	sessionKey []byte                // what the console seals its cookies with
	log        *testenv.LockedBuffer // conclave dev's stderr
	browser    context.Context       // the Chromium all tests open tabs in
}

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	dir, remove, err := testenv.GoBuildTemp(context.Background(), "console-test", "./cmd/conclave", "./examples/coven-agent", "./examples/acp-agent")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer remove()
	dev.conclave, dev.covenAgent = filepath.Join(dir, "conclave"), filepath.Join(dir, "coven-agent")
	// A gated turn streams "Working on", then waits for a file named
	// release in its workspace before it streams its chunks: the test
	// decides when the logs move, so it sees them arrive live.
	types := filepath.Join(dir, "types.yaml")
	// And the example agent of @agentclientprotocol/sdk under the
	// librarian permission policy: it asks to edit a file outside its
	// workspace, which the Librarian (configured below) escalates.
	root, _ := filepath.Abs(filepath.Join("..", "..", ".."))
	npm := filepath.Join(root, "node_modules", "@agentclientprotocol", "sdk", "dist", "examples", "agent.js")
	if err := os.WriteFile(types, fmt.Appendf(nil, "agent_types:\n  - id: console-gated\n    name: gated example\n    command: [%q, \"-mode\", \"gated\", \"-chunks\", \"3\"]\n    permission: allow\n    enabled: true\n"+
		"  - id: console-governed\n    name: governed example\n    command: [%q, %q]\n    protocol: acp\n    permission: librarian\n    enabled: true\n",
		filepath.Join(dir, "acp-agent"), filepath.Join(root, "node_modules", ".bin", "node"), npm), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	libConfig := filepath.Join(dir, "librarian")
	if err := escalatingLibrarian(root, libConfig); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dev.workspace = filepath.Join(dir, "ws")
	if err := os.Mkdir(dev.workspace, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dev.sessionKey = session.GenerateKey()
	stop, err := startDev(dir, types, libConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()

	chromium, err := testenv.Chromium()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(chromium), chromedp.UserDataDir(filepath.Join(dir, "chromium")), chromedp.WindowSize(1280, 900)}
	for name, v := range testenv.ChromiumFlags() {
		opts = append(opts, chromedp.Flag(name, v))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		fmt.Fprintln(os.Stderr, "start chromium:", err)
		return 1
	}
	dev.browser = bctx
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "conclave dev's log:\n%s\n", dev.log)
	}
	return code
}

// startDev runs `conclave dev` on free ports and reads where it listens.
func startDev(dir, types, libConfig string) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Run in dir: no examples/tool-agents there, so the bridge stays off.
	d, err := testenv.StartDev(ctx, dev.conclave, dir, []string{
		"--console-session-key=" + base64.StdEncoding.EncodeToString(dev.sessionKey), "--console-refresh-interval=300ms",
		"--runner-agent-types=" + types, "--runner-workspace-roots=" + dir, "--data-dir", filepath.Join(dir, "data"),
		"--librarian-config-dir=" + libConfig}, nil)
	if err != nil {
		return nil, err
	}
	dev.log = d.LogBuffer()
	stop := func() {
		// SIGTERM lets the runner stop its agents; a gated one still
		// waiting is released first.
		_ = os.WriteFile(filepath.Join(dev.workspace, "release"), nil, 0o644)
		_ = d.Stop()
	}
	dev.addrs = d.Addrs()
	for _, want := range []string{"console HTTP", "gateway gRPC", "gateway HTTP", "bus WebSocket", "runner HTTP", "librarian HTTP"} {
		if dev.addrs[want] == "" {
			stop()
			return nil, fmt.Errorf("conclave dev's endpoint table has no %q row: %v\n%s", want, dev.addrs, dev.log)
		}
	}
	dev.console = "http://" + dev.addrs["console HTTP"]
	return stop, nil
}

// escalatingLibrarian writes a Librarian configuration into dir: the
// built-in registry, and a protocol that escalates a deviation (the
// governed agent's edit outside its workspace) and judges changes the
// knowledge graph does not track (docs/governance.md).
func escalatingLibrarian(root, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"agents.yaml", "protocol.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, "functions", "librarian", "config", f))
		if err != nil {
			return err
		}
		if f == "protocol.yaml" {
			b = bytes.Replace(b, []byte("strict_mode: true"), []byte("strict_mode: false\n    require_known_targets: false"), 1)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tab opens a browser tab for one test.
func tab(t *testing.T) context.Context {
	t.Helper()
	if testing.Short() {
		t.Skip("drives headless Chromium against conclave dev")
	}
	ctx, cancel := chromedp.NewContext(dev.browser)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	return ctx
}

func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %v\npage:\n%s", err, pageText(ctx))
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor waits until expr (JavaScript) is true in the page. It asks
// again and again rather than polling inside the page, so that it
// outlives the navigations a form's submission causes.
func waitFor(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	check := fmt.Sprintf(`(() => { try { return !!(%s); } catch (e) { return false; } })()`, expr)
	var last error
	// Its own deadline, shorter than the tab's, leaves time to show the
	// page when it fails.
	deadline := time.After(45 * time.Second)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](check))
		if err == nil && ok {
			return
		}
		last = err
		select {
		case <-deadline:
			t.Fatalf("waiting until %s: gave up after 45s (last error: %v)\npage:\n%s", what, last, pageText(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func pageText(ctx context.Context) string {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(c, chromedp.Evaluate[string](`location.href + "\n" + (document.body ? document.body.innerText : "")`))
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return s
}

// text is an element's text, by CSS selector.
func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	return eval[string](t, ctx, fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText`, css))
}

// screenshot writes the page as an artifact: into $CONCLAVE_CONSOLE_SCREENSHOTS
// when set (docs/console to refresh the documentation's), else into
// conclave-console-screenshots in the temporary directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("CONCLAVE_CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "conclave-console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// noInjection checks that nothing from a service ran or became markup.
func noInjection(t *testing.T, ctx context.Context, container string) {
	t.Helper()
	if got := eval[string](t, ctx, `String(window.pwned)`); got != "undefined" {
		t.Fatalf("a payload's script ran: window.pwned = %s", got)
	}
	if n := eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll(%q).length`, container+" script, "+container+" img")); n != 0 {
		t.Fatalf("%d elements were injected into %s", n, container)
	}
}

// onlyConsoleRequests checks that the page asked nothing of any host but
// the console.
func onlyConsoleRequests(t *testing.T, ctx context.Context, base string) {
	t.Helper()
	urls := eval[[]string](t, ctx, `performance.getEntries().map(e => e.name).filter(n => /^[a-z]+:/.test(n))`)
	if len(urls) == 0 {
		t.Fatal("the page made no requests at all?")
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, base+"/") && u != base {
			t.Errorf("the page requested %s, not from the console", u)
		}
	}
}

// startCovenAgent connects the example coven agent to the gateway, pausing
// stepDelay between a reply's events.
func startCovenAgent(t *testing.T, id, name string, stepDelay time.Duration) {
	t.Helper()
	cmd := exec.Command(dev.covenAgent, "--addr", dev.addrs["gateway gRPC"], "--agent-id", id, "--name", name,
		"--capabilities", "chat,echo", "--step-delay", stepDelay.String())
	var out testenv.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("coven agent %s:\n%s", id, out.String())
		}
	})
}

func TestAgentAppearsAndChatStreams(t *testing.T) {
	ctx := tab(t)
	do(t, ctx, chromedp.Navigate(dev.console+"/agents"), chromedp.WaitVisible(chromedp.ID("agents-table")))
	startCovenAgent(t, "console-e2e", "console e2e agent", 100*time.Millisecond)
	// The table refreshes itself: the agent appears without a reload.
	eval[chromedp.Void](t, ctx, `window.__sameDocument = true`)
	waitFor(t, ctx, "the agent is listed", `!!document.querySelector('tr[data-agent="console-e2e"]')`)
	if row := text(t, ctx, `tr[data-agent="console-e2e"]`); !strings.Contains(row, "console e2e agent") || !strings.Contains(row, "chat, echo") || !strings.Contains(row, "IDLE") {
		t.Fatalf("agent row: %q", row)
	}
	// A reply streams in: the log grows event by event, and was partial
	// before it was done.
	eval[chromedp.Void](t, ctx, `window.__obs = {batches: 0, partial: false};
		new MutationObserver(() => {
			const kinds = [...document.querySelectorAll('#chat-log li')].map(li => li.classList[1]);
			window.__obs.batches++;
			if (kinds.length && !kinds.includes('done')) window.__obs.partial = true;
		}).observe(document.getElementById('chat-log'), {childList: true, subtree: true, characterData: true})`)
	payload := `<script>window.pwned=1</script><img src=x onerror="window.pwned=2"> hello console`
	do(t, ctx, chromedp.SetValue(chromedp.ID("agent_id"), "console-e2e"), chromedp.SendKeys(chromedp.ID("content"), payload),
		chromedp.Click(chromedp.ID("send")))
	waitFor(t, ctx, "the reply has ended", `document.getElementById('chat-log').dataset.state === 'ended'`)
	log := text(t, ctx, "#chat-log")
	for _, want := range []string{"THINKING", "REPLY", "You said: <script>window.pwned=1</script>", "TOOL CALL", "clock", "TOOL RESULT", "FILE", "echo.txt", "DONE"} {
		if !strings.Contains(log, want) {
			t.Errorf("the chat log lacks %q:\n%s", want, log)
		}
	}
	if batches := eval[int](t, ctx, `window.__obs.batches`); batches < 3 || !eval[bool](t, ctx, `window.__obs.partial`) {
		t.Errorf("the reply did not stream in: %d changes, partial %v", batches, eval[bool](t, ctx, `window.__obs.partial`))
	}
	noInjection(t, ctx, "#chat-log")
	if trace := text(t, ctx, "#chat-trace"); !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(strings.TrimSpace(trace)) {
		t.Errorf("chat trace id: %q", trace)
	}
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Error("the page reloaded")
	}
	screenshot(t, ctx, "agents")

	// Cancel: cancelling a reply after its first chunk ends it with
	// cancelled, not done. The reply is that of an agent that pauses 3 s
	// between events, so that the cancel (a click, the console, the
	// gateway, the agent) lands before the reply ends on a loaded machine
	// too: with 100 ms pauses the whole reply took a second, and a busy
	// machine's cancel came after its end.
	startCovenAgent(t, "console-slow", "console slow agent", 3*time.Second)
	waitFor(t, ctx, "the slow agent is listed", `!!document.querySelector('tr[data-agent="console-slow"]')`)
	do(t, ctx, chromedp.SetValue(chromedp.ID("agent_id"), "console-slow"),
		chromedp.SetValue(chromedp.ID("content"), "a reply to cancel"), chromedp.Click(chromedp.ID("send")))
	waitFor(t, ctx, "the reply starts", `!!document.querySelector('#chat-log li.text')`)
	do(t, ctx, chromedp.Click(chromedp.ID("cancel-chat")))
	waitFor(t, ctx, "the cancelled reply has ended", `document.getElementById('chat-log').dataset.state === 'ended'`)
	if n := eval[int](t, ctx, `document.querySelectorAll('#chat-log li.cancelled').length`); n != 1 || eval[int](t, ctx, `document.querySelectorAll('#chat-log li.done').length`) != 0 {
		t.Fatalf("after cancel:\n%s", text(t, ctx, "#chat-log"))
	}
	onlyConsoleRequests(t, ctx, dev.console)
}

func TestBusTopicViewerShowsAPublishedMessage(t *testing.T) {
	ctx := tab(t)
	do(t, ctx, chromedp.Navigate(dev.console+"/bus"), chromedp.WaitVisible(chromedp.ID("pattern")))
	// Keyboard only: type the pattern and press Enter.
	do(t, ctx, chromedp.Focus(chromedp.ID("pattern")), chromedp.SendKeys(chromedp.ID("pattern"), "console-e2e:*\r"))
	waitFor(t, ctx, "the viewer is subscribed", `document.getElementById('watch-status').dataset.state === 'watching'`)

	cmd := exec.Command(dev.conclave, "bus", "send-message", "--topic", "console-e2e:1",
		"--payload", `{"type":"note","text":"<script>window.pwned=3</script><img src=x onerror=\"window.pwned=4\">hello bus"}`)
	cmd.Env = append(os.Environ(), "BUB_BUS_URL=ws://"+dev.addrs["bus WebSocket"])
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bub send-message: %v\n%s", err, out)
	}
	// The publisher's acks include the console's.
	if !strings.Contains(string(out), "seen by the console's topic viewer") || !strings.Contains(string(out), `"success":true`) {
		t.Fatalf("bub send-message printed %s", out)
	}
	waitFor(t, ctx, "the message is shown", `[...document.querySelectorAll('#bus-messages tr')].some(r => r.innerText.includes('console-e2e:1'))`)
	row := text(t, ctx, "#bus-messages tr")
	if !strings.Contains(row, `<script>window.pwned=3</script>`) || !strings.Contains(row, "seen by the console's topic viewer") {
		t.Fatalf("message row: %q", row)
	}
	noInjection(t, ctx, "#bus-messages")

	// Publishing from the page shows the acks, the viewer's among them.
	do(t, ctx, chromedp.SendKeys(chromedp.ID("topic"), "console-e2e:2"), chromedp.SendKeys(chromedp.ID("payload"), `{"type":"note","text":"from the page"}`),
		chromedp.Click(chromedp.ID("publish")))
	waitFor(t, ctx, "the acks are shown", `document.getElementById('publish-result').innerText.includes('Acks')`)
	if res := text(t, ctx, "#publish-result"); !strings.Contains(res, "routed") || !strings.Contains(res, "console-watch-") {
		t.Fatalf("publish result: %q", res)
	}
	waitFor(t, ctx, "the page's message is shown", `[...document.querySelectorAll('#bus-messages tr')].some(r => r.innerText.includes('console-e2e:2'))`)
	screenshot(t, ctx, "bus")
	onlyConsoleRequests(t, ctx, dev.console)
}

func TestRunnerInstanceShowsLogsAsTheyCome(t *testing.T) {
	ctx := tab(t)
	do(t, ctx, chromedp.Navigate(dev.console+"/runner"), chromedp.WaitVisible(chromedp.ID("launch-form")))
	if types := text(t, ctx, "#agent_type"); !strings.Contains(types, "console-gated") {
		t.Fatalf("agent types offered: %q", types)
	}
	do(t, ctx, chromedp.SetValue(chromedp.ID("agent_type"), "console-gated"), chromedp.SendKeys(chromedp.ID("workspace_path"), dev.workspace),
		chromedp.SendKeys(chromedp.ID("prompt"), "console e2e <script>window.pwned=5</script>"), chromedp.Click(chromedp.ID("launch")))
	waitFor(t, ctx, "the instance page opens", `location.pathname.startsWith('/runner/instances/') && !!document.getElementById('logs')`)
	if flash := text(t, ctx, "#flash"); !strings.Contains(flash, "Launched") {
		t.Errorf("flash: %q", flash)
	}
	waitFor(t, ctx, "the turn has started", `document.getElementById('logs').innerText.includes('Working on')`)
	// The agent waits for its release file: nothing after "Working on" can
	// be in the logs yet.
	if logs := text(t, ctx, "#logs"); strings.Contains(logs, "chunk 1") {
		t.Fatalf("chunks before the release:\n%s", logs)
	}
	eval[chromedp.Void](t, ctx, `window.__sameDocument = true`)
	if err := os.WriteFile(filepath.Join(dev.workspace, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the chunks arrive", `document.getElementById('logs').innerText.includes('chunk 3')`)
	if !eval[bool](t, ctx, `window.__sameDocument === true`) {
		t.Error("the page reloaded to show the logs")
	}
	if logs := text(t, ctx, "#logs"); !strings.Contains(logs, "<script>window.pwned=5</script>") {
		t.Errorf("the prompt is not shown as text in the logs:\n%s", logs)
	}
	noInjection(t, ctx, "#logs")
	if status := text(t, ctx, "#status"); status == "" || strings.EqualFold(status, "unknown") {
		t.Errorf("status: %q", status)
	}
	screenshot(t, ctx, "runner-instance")
	// The instance is listed on the runner page with its status, from the
	// runner's list: so also in another session, which never opened it.
	id := strings.TrimPrefix(eval[string](t, ctx, `location.pathname`), "/runner/instances/")
	do(t, ctx, chromedp.Navigate(dev.console+"/runner"), chromedp.WaitVisible(chromedp.ID("instances")))
	row := fmt.Sprintf(`#instances a[href="/runner/instances/%s"]`, id)
	if n := eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll(%q).length`, row)); n != 1 {
		t.Errorf("instance %s is listed %d times: %q", id, n, text(t, ctx, "#instances"))
	}
	if list := text(t, ctx, "#instances"); !strings.Contains(list, "console-gated") {
		t.Errorf("instances: %q", list)
	}
	if page := freshSessionGet(t, "/runner"); !strings.Contains(page, `href="/runner/instances/`+id+`"`) {
		t.Errorf("another session's runner page does not list instance %s", id)
	}
	onlyConsoleRequests(t, ctx, dev.console)
}

// TestGovernedInstanceShowsTheApprovalBanner: an instance whose turn waits
// for a person's decision on a permission request the Librarian escalated
// shows a banner linking to the review, live; deciding it in the console's
// review queue lets the agent go on, and the banner goes.
func TestGovernedInstanceShowsTheApprovalBanner(t *testing.T) {
	ctx := tab(t)
	do(t, ctx, chromedp.Navigate(dev.console+"/runner"), chromedp.WaitVisible(chromedp.ID("launch-form")))
	do(t, ctx, chromedp.SetValue(chromedp.ID("agent_type"), "console-governed"), chromedp.SendKeys(chromedp.ID("workspace_path"), dev.workspace),
		chromedp.SendKeys(chromedp.ID("prompt"), "improve the config"), chromedp.Click(chromedp.ID("launch")))
	waitFor(t, ctx, "the instance page opens", `location.pathname.startsWith('/runner/instances/') && !!document.getElementById('logs')`)
	if !eval[bool](t, ctx, `document.getElementById('approval-banner').hidden`) {
		t.Error("the approval banner shows before the agent asked")
	}
	waitFor(t, ctx, "the approval banner shows", `!document.getElementById('approval-banner').hidden && document.getElementById('status').textContent === 'awaiting_approval'`)
	lib := "http://" + dev.addrs["librarian HTTP"]
	review := eval[string](t, ctx, `document.getElementById('approval-review').getAttribute('href')`)
	if !strings.HasPrefix(review, lib+"/review/req-") {
		t.Fatalf("the banner links to %q, not to the Librarian's review page", review)
	}
	screenshot(t, ctx, "runner-awaiting-approval")
	// A page opened now shows it too, from the instance's status.
	id := strings.TrimPrefix(eval[string](t, ctx, `location.pathname`), "/runner/instances/")
	if page := freshSessionGet(t, "/runner/instances/"+id); !strings.Contains(page, `id="approval-banner">`) || !strings.Contains(page, review) {
		t.Errorf("a fresh instance page has no approval banner")
	}
	requestID := review[strings.LastIndex(review, "/")+1:]
	row := fmt.Sprintf(`tr[data-request=%q]`, requestID)
	do(t, ctx, chromedp.Click(chromedp.ID("approval-queue")))
	waitFor(t, ctx, "the request is in the console's review queue", fmt.Sprintf(`!!document.querySelector(%q)`, row))
	if reason := text(t, ctx, row); !strings.Contains(reason, "outside_workspace") {
		t.Errorf("the queue's row: %q", reason)
	}
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(row+" textarea"), "The config change is fine."),
		chromedp.Click(chromedp.CSS(row+` button[value="approve"]`)))
	waitFor(t, ctx, "the decision is confirmed", `!!document.getElementById('flash')`)
	do(t, ctx, chromedp.Navigate(dev.console+"/runner/instances/"+id), chromedp.WaitVisible(chromedp.ID("logs")))
	waitFor(t, ctx, "the agent goes on", `document.getElementById('logs').innerText.includes("I've successfully updated the configuration")`)
	waitFor(t, ctx, "the banner goes", `document.getElementById('approval-banner').hidden && document.getElementById('status').textContent !== 'awaiting_approval'`)
}

// freshSessionGet fetches a page of the (open) console in a session of
// its own, and returns its HTML.
func freshSessionGet(t *testing.T, path string) string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	resp, err := (&http.Client{Jar: jar}).Get(dev.console + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	return string(page)
}

const design = "# Console Feature Design\n\n## Overview\nWhat.\n\n## Design\nHow.\n\n## Alternatives\nNone.\n"

func TestEscalatedRequestIsApprovedFromThePage(t *testing.T) {
	ctx := tab(t)
	lib := "http://" + dev.addrs["librarian HTTP"]
	body, _ := json.Marshal(map[string]any{
		"agent_id": "claude-3", "session_id": "console-e2e", "request_type": "APPROVAL", "action": "create",
		"target_type": "design", "target_path": "docs/design/console-e2e.md", "content": design,
		"rationale": "The console's end-to-end test", "risk_assessment": "high: <script>window.pwned=6</script> changes a design",
	})
	resp, err := http.Post(lib+"/agent/request", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var decided struct {
		RequestID string `json:"request_id"`
		Status    string `json:"status"`
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(data, &decided); err != nil || decided.Status != "escalated" {
		t.Fatalf("the request was not escalated: %d %s", resp.StatusCode, data)
	}
	row := fmt.Sprintf(`tr[data-request=%q]`, decided.RequestID)
	do(t, ctx, chromedp.Navigate(dev.console+"/librarian"), chromedp.WaitVisible(chromedp.ID("queue")))
	waitFor(t, ctx, "the request is in the queue", fmt.Sprintf(`!!document.querySelector(%q)`, row))
	if link := eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q).getAttribute('href')`, row+" a")); !strings.HasPrefix(link, lib+"/review/"+decided.RequestID) {
		t.Errorf("the link to the Librarian's review page: %q", link)
	}
	noInjection(t, ctx, "#queue")
	screenshot(t, ctx, "librarian-queue")
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(row+" textarea"), "Approved from the console's test."),
		chromedp.Click(chromedp.CSS(row+` button[value="approve"]`)))
	waitFor(t, ctx, "the decision is confirmed", `!!document.getElementById('flash')`)
	if flash := text(t, ctx, "#flash"); !strings.Contains(flash, "Request approved") {
		t.Fatalf("flash: %q", flash)
	}
	if n := eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll(%q).length`, row)); n != 0 {
		t.Error("the approved request is still in the queue")
	}
	// The decision is listed, as the Librarian lists it: by the reviewer,
	// with the agent and the comment, and with the trace of the console's
	// call.
	if decisions := text(t, ctx, "#decisions"); !strings.Contains(decisions, decided.RequestID) || !strings.Contains(strings.ToLower(decisions), "approved") ||
		!strings.Contains(decisions, "claude-3") || !strings.Contains(decisions, "reviewer") || !strings.Contains(decisions, "Approved from the console's test.") {
		t.Errorf("recent decisions: %q", decisions)
	}
	if caption := text(t, ctx, "#decisions caption"); !strings.Contains(caption, "as the Librarian lists them") {
		t.Errorf("the decisions are not the Librarian's list: %q", caption)
	}
	// The Librarian agrees.
	st, err := http.Get(lib + "/agent/status/" + decided.RequestID + "?agent_id=claude-3")
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(st.Body)
	st.Body.Close()
	if !strings.Contains(string(data), `"status":"approved"`) || !strings.Contains(string(data), "Approved from the console") {
		t.Fatalf("status after approval: %s", data)
	}
	// Another session sees the decision too: it comes from the Librarian,
	// not from what this console remembers.
	if page := freshSessionGet(t, "/librarian"); !strings.Contains(page[strings.Index(page, `id="decisions"`)+1:], decided.RequestID) {
		t.Error("another session does not see the decision")
	}
	do(t, ctx, chromedp.Navigate(dev.console+"/librarian"), chromedp.WaitVisible(chromedp.ID("decisions")))
	screenshot(t, ctx, "librarian-approved")
}

// TestFirstPage: the overview is under 100 KB with everything it loads,
// and loads nothing from another host.
func TestFirstPage(t *testing.T) {
	ctx := tab(t)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	total := 0
	for _, path := range []string{"/", "/static/console.css", "/static/console.js"} {
		resp, err := client.Get(dev.console + path)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		total += int(n)
	}
	if total >= 100<<10 {
		t.Errorf("the first page weighs %d bytes", total)
	}
	t.Logf("the first page weighs %d bytes, assets included", total)
	do(t, ctx, chromedp.Navigate(dev.console+"/"), chromedp.WaitVisible(chromedp.ID("panel-librarian")))
	for _, panel := range []string{"agents", "bus", "runner", "librarian"} {
		if n := eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll('#panel-%s .banner').length`, panel)); n != 0 {
			t.Errorf("the %s panel has a banner with every service up: %s", panel, text(t, ctx, "#panel-"+panel))
		}
	}
	onlyConsoleRequests(t, ctx, dev.console)
	screenshot(t, ctx, "overview")
}

// TestExpiredSession: a session past its expiry goes to sign-in, even on
// the open console.
func TestExpiredSession(t *testing.T) {
	ctx := tab(t)
	codec, err := session.NewCodec(dev.sessionKey, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	s := codec.New(session.Tokens{}, true)
	s.Expires = time.Now().Add(-time.Minute).Unix()
	value, err := codec.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", dev.console+"/agents", nil)
	req.AddCookie(&http.Cookie{Name: session.CookieName, Value: value})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/signin?") || !strings.Contains(loc, "expired=1") {
		t.Fatalf("expired session: %d %s", resp.StatusCode, loc)
	}
	do(t, ctx, chromedp.Navigate(dev.console+loc), chromedp.WaitVisible(chromedp.ID("expired")))
	screenshot(t, ctx, "signin-expired")
}

// TestForgedFormIsRefused: a page on another origin that posts a form to
// the console gets 403, in the browser as from a program.
func TestForgedFormIsRefused(t *testing.T) {
	ctx := tab(t)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/runner/launch">
<input name="agent_type" value="console-gated"><input name="workspace_path" value="/tmp"></form>
<script>document.getElementById('f').submit()</script>`, dev.console)
	}))
	defer evil.Close()
	do(t, ctx, chromedp.Navigate(evil.URL))
	waitFor(t, ctx, "the console's answer", `location.href.startsWith(`+fmt.Sprintf("%q", dev.console)+`) && !!document.getElementById('problem')`)
	if got := text(t, ctx, "h1"); !strings.Contains(got, "403") {
		t.Fatalf("forged form: %q", got)
	}
	screenshot(t, ctx, "forged-form")
	// From a program, with a valid session but no token.
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	if resp, err := client.Get(dev.console + "/"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	resp, err := client.PostForm(dev.console+"/bus/publish", map[string][]string{"topic": {"x"}, "payload": {"{}"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a form without the CSRF token: %s", resp.Status)
	}
}

// TestServiceDownShowsABanner: a console whose runner is down shows a
// banner on the runner's panel, and the other panels work.
func TestServiceDownShowsABanner(t *testing.T) {
	ctx := tab(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()
	tel, err := telemetry.New(t.Context(), telemetry.Config{ServiceName: "console-test"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := service.Config{HTTPAddr: "127.0.0.1:0", GatewayURL: "http://" + dev.addrs["gateway HTTP"], BusURL: "ws://" + dev.addrs["bus WebSocket"],
		RunnerURL: down, LibrarianURL: "http://" + dev.addrs["librarian HTTP"], SessionTTL: time.Hour, AllowUnauthenticated: true,
		BackendTimeout: 5 * time.Second, ChatTimeout: time.Minute, RefreshInterval: time.Second, MaxStreams: 16, StreamMaxAge: time.Minute,
		ShutdownTimeout: 5 * time.Second}
	c, err := service.New(cfg, service.Deps{Logger: slog.New(slog.DiscardHandler), Telemetry: tel})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	<-c.Ready()
	probe, err := http.Get(c.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	probe.Body.Close()
	t.Logf("probe: %s", probe.Status)
	// Navigate to about:blank first, then by script: a plain Navigate to
	// this second console's origin, after the other tests' tabs, waited
	// for a load event that never came.
	do(t, ctx, chromedp.Navigate("about:blank"))
	eval[chromedp.Void](t, ctx, fmt.Sprintf(`location.assign(%q)`, c.URL()+"/"))
	waitFor(t, ctx, "the overview of the console whose runner is down", `!!document.querySelector('#panel-runner')`)
	if banner := text(t, ctx, "#panel-runner .banner"); !strings.Contains(banner, "UNAVAILABLE") || !strings.Contains(banner, "runner") {
		t.Fatalf("runner banner: %q", banner)
	}
	for _, panel := range []string{"agents", "bus", "librarian"} {
		if n := eval[int](t, ctx, fmt.Sprintf(`document.querySelectorAll('#panel-%s .banner').length`, panel)); n != 0 {
			t.Errorf("the %s panel has a banner: %s", panel, text(t, ctx, "#panel-"+panel))
		}
	}
	screenshot(t, ctx, "service-down")
	eval[chromedp.Void](t, ctx, fmt.Sprintf(`location.assign(%q)`, c.URL()+"/runner"))
	waitFor(t, ctx, "the runner page's banner", `location.pathname === '/runner' && !!document.querySelector('[data-banner="runner"]')`)
}
