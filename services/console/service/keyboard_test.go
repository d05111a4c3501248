package service_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// describeJS describes an element the way the walks compare them: its
// tag, then its id, href or name, then its text.
const describeJS = `(e) => {
	const key = e.id ? "#" + e.id : e.getAttribute("href") ?? e.getAttribute("name") ?? "";
	return e.tagName.toLowerCase() + " " + key + " " + (e.innerText || e.value || "").trim().split("\n")[0].slice(0, 40);
}`

// focusJS describes the focused element; "body" when nothing has focus.
const focusJS = `(() => {
	const e = document.activeElement;
	if (!e || e === document.body) return "body";
	return (` + describeJS + `)(e);
})()`

// focusShownJS is true when the focused element draws its focus: an outline
// of some width, on screen (the skip link moves in when focused).
const focusShownJS = `(() => {
	const e = document.activeElement, s = getComputedStyle(e), r = e.getBoundingClientRect();
	return s.outlineStyle !== "none" && parseFloat(s.outlineWidth) > 0 && r.width > 0 && r.right > 0 && r.left < innerWidth;
})()`

// controlsJS lists, as describeJS gives them, every control on the page a
// keyboard user must be able to reach: visible links, enabled buttons and
// form fields.
const controlsJS = `[...document.querySelectorAll('a[href], button:not([disabled]), input:not([type=hidden]):not([disabled]), select:not([disabled]), textarea:not([disabled])')]
	.filter(e => e.getClientRects().length > 0 && !e.classList.contains("skip"))
	.map(` + describeJS + `)`

// tabWalk presses Tab from the top of the page until focus comes back
// round to the skip link, and returns what had focus after each press. Every
// stop must show its focus.
func tabWalk(t *testing.T, ctx context.Context) []string {
	t.Helper()
	var stops []string
	for i := 0; i < 200; i++ {
		do(t, ctx, chromedp.KeyEvent(kb.Tab))
		f := eval[string](t, ctx, focusJS)
		if i > 0 && strings.HasPrefix(f, "a #main ") {
			return stops
		}
		if f == "body" {
			// Past the last control focus leaves the document; the next Tab
			// starts again at the top.
			if len(stops) > 0 && stops[len(stops)-1] == "body" {
				t.Fatalf("focus left the page twice in a row after %q", stops)
			}
			stops = append(stops, f)
			continue
		}
		if !eval[bool](t, ctx, focusShownJS) {
			t.Errorf("%s: %s has focus but does not show it", eval[string](t, ctx, `location.pathname`), f)
		}
		stops = append(stops, f)
	}
	t.Fatalf("Tab never came back round to the skip link: %q", stops)
	return nil
}

// tabTo presses Tab until the element focusJS describes with the given
// prefix has focus.
func tabTo(t *testing.T, ctx context.Context, prefix string) {
	t.Helper()
	var seen []string
	for i := 0; i < 100; i++ {
		do(t, ctx, chromedp.KeyEvent(kb.Tab))
		f := eval[string](t, ctx, focusJS)
		if strings.HasPrefix(f, prefix) {
			return
		}
		seen = append(seen, f)
	}
	t.Fatalf("Tab never reached %q; it went through %q", prefix, seen)
}

// TestKeyboardOnly uses the console with the keyboard alone: on every page
// Tab reaches the skip link first and then every control in the page's
// order, each showing its focus, and no positive tabindex reorders them;
// Enter follows the navigation; the chat form is filled and sent with keys
// and its reply streams in; and a live refresh of the agents table keeps
// the focus where the user left it. The test sends no mouse event.
func TestKeyboardOnly(t *testing.T) {
	ctx := tab(t)
	// Cookies are not kept apart by port: another test's console on
	// 127.0.0.1 may have left its session cookie, which this one cannot
	// open. Start signed out, as a new visitor.
	if _, err := chromedp.Call(ctx, network.ClearBrowserCookies, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	startCovenAgent(t, "keyboard-agent", "keyboard agent", 100*time.Millisecond)
	do(t, ctx, chromedp.Navigate(dev.console+"/agents"))
	waitFor(t, ctx, "the agent is listed", `!!document.querySelector('tr[data-agent="keyboard-agent"]')`)

	for _, page := range []string{"/", "/agents", "/bus", "/runner", "/librarian"} {
		do(t, ctx, chromedp.Navigate(dev.console+page), chromedp.WaitReady("main"))
		if n := eval[int](t, ctx, `[...document.querySelectorAll('[tabindex]')].filter(e => e.tabIndex > 0).length`); n != 0 {
			t.Errorf("%s: %d elements reorder the Tab order with a positive tabindex", page, n)
		}
		want := eval[[]string](t, ctx, controlsJS)
		stops := tabWalk(t, ctx)
		if len(stops) == 0 || !strings.HasPrefix(stops[0], "a #main ") {
			t.Errorf("%s: the first Tab stop is %q, not the skip link", page, stops)
		}
		for _, c := range want {
			if !slices.Contains(stops, c) {
				t.Errorf("%s: Tab never reaches %q; it stops at %q", page, c, stops)
			}
		}
	}

	// From the overview, the skip link and then the navigation, by keys.
	do(t, ctx, chromedp.Navigate(dev.console+"/"), chromedp.WaitReady("main"))
	do(t, ctx, chromedp.KeyEvent(kb.Tab), chromedp.KeyEvent(kb.Enter))
	if f := eval[string](t, ctx, focusJS); !strings.HasPrefix(f, "main #main") {
		t.Errorf("after Enter on the skip link focus is on %q, not the main content", f)
	}
	do(t, ctx, chromedp.Navigate(dev.console+"/"), chromedp.WaitReady("main"))
	tabTo(t, ctx, "a /agents Agents")
	do(t, ctx, chromedp.KeyEvent(kb.Enter))
	waitFor(t, ctx, "Enter opened the agents page", `location.pathname === "/agents" && !!document.getElementById("chat-form")`)

	// The chat, by keys: the agent picked by typing its name in the
	// select, the message typed, Enter on Send.
	tabTo(t, ctx, "select #agent_id")
	do(t, ctx, chromedp.KeyEvent("keyboard"))
	if v := eval[string](t, ctx, `document.getElementById("agent_id").value`); v != "keyboard-agent" {
		t.Fatalf("typing the agent's name selected %q", v)
	}
	tabTo(t, ctx, "textarea #content")
	do(t, ctx, chromedp.KeyEvent("hello from the keyboard"))
	tabTo(t, ctx, "button #send")
	do(t, ctx, chromedp.KeyEvent(kb.Enter))
	waitFor(t, ctx, "the reply has ended", `document.getElementById('chat-log').dataset.state === 'ended'`)
	if log := text(t, ctx, "#chat-log"); !strings.Contains(log, "You said: hello from the keyboard") || !strings.Contains(log, "DONE") {
		t.Fatalf("the chat sent by keys:\n%s", log)
	}

	// A live refresh replaces the agents table; a keyboard user on one of
	// its links must not be thrown back to the top of the page.
	chatLink := "a /agents?agent=keyboard-agent#chat"
	do(t, ctx, chromedp.Navigate(dev.console+"/agents"), chromedp.WaitReady("main"))
	tabTo(t, ctx, chatLink)
	startCovenAgent(t, "keyboard-agent-2", "second keyboard agent", 100*time.Millisecond)
	waitFor(t, ctx, "the table is refreshed with the second agent", `!!document.querySelector('tr[data-agent="keyboard-agent-2"]')`)
	if f := eval[string](t, ctx, focusJS); !strings.HasPrefix(f, chatLink) {
		t.Errorf("after the table refreshed, focus is on %q, not %q", f, chatLink)
	}
	screenshot(t, ctx, "keyboard")
}
