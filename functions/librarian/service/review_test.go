package service_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// chromium finds Debian's Chromium (scripts/install-test-deps.sh installs it).
func chromium(t *testing.T) string {
	t.Helper()
	p, err := testenv.Chromium()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// artifactsDir is where the review page's screenshot is kept after the
// run: $CONCLAVE_TEST_ARTIFACTS, or .artifacts/ at the repository root.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CONCLAVE_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", ".artifacts")
	}
	dir = filepath.Join(dir, "librarian")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReviewPageInChromium: a reviewer opens human_review_url in a real
// browser, signs in with a reviewer token, reads the request and approves
// it; the request is approved and the approval event is on the queue.
func TestReviewPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("drives headless Chromium")
	}
	t.Parallel()
	e := newEnv(t, nil)
	req := librarianApproval()
	req["risk_assessment"] = "high: changes the authentication flow"
	resp := e.do(t, "POST", "/agent/request", claudeToken, req).response(t)
	if resp.Status != "escalated" {
		t.Fatalf("not escalated: %v", resp)
	}
	e.events(t) // submitted, escalated

	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(chromium(t)), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000)}
	for name, v := range testenv.ChromiumFlags() {
		opts = append(opts, chromedp.Flag(name, v))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return v
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(resp.GetHumanReviewUrl()), chromedp.WaitVisible(`#token`)); err != nil {
		t.Fatal(err)
	}
	signinURL, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil || !strings.Contains(signinURL, "/review/signin?next=") {
		t.Fatalf("the page did not ask for a sign-in: %s %v", signinURL, err)
	}
	// An agent's token does not sign a reviewer in.
	if err := chromedp.Do(ctx, chromedp.SendKeys(`#token`, claudeToken), chromedp.Click(`#signin`), chromedp.WaitVisible(`#error`)); err != nil {
		t.Fatal(err)
	}
	if problem := text(`#error`); !strings.Contains(problem, "not a reviewer token") {
		t.Fatalf("an agent token signed in: %q", problem)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(`#token`, reviewerToken), chromedp.Click(`#signin`), chromedp.WaitVisible(`#decide`)); err != nil {
		t.Fatal(err)
	}
	status, content, results := text(`#status`), text(`#content`), text(`#results`)
	if !strings.EqualFold(status, "escalated") || !strings.Contains(content, "New Feature Design") || !strings.Contains(results, "deviations_and_risk") {
		t.Fatalf("page shows status %q, content %q, results %q", status, content, results)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(`#comment`, "Reviewed the authentication change with the security team."),
		chromedp.Click(`#approve`), chromedp.WaitVisible(`#done`)); err != nil {
		t.Fatal(err)
	}
	if status := text(`#status`); !strings.EqualFold(status, "approved") {
		t.Fatalf("status after approving: %q", status)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(artifactsDir(t), "review-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	// The API and the queue agree with the page.
	st := e.do(t, "GET", "/agent/status/"+resp.RequestId, claudeToken, nil)
	if st.status != 200 || !strings.Contains(string(st.body), `"status":"approved"`) || !strings.Contains(string(st.body), "alice") {
		t.Fatalf("status %d %s", st.status, st.body)
	}
	if got := types(e.events(t)); !slices.Equal(got, []string{"librarian.request.approved"}) {
		t.Fatalf("events %v", got)
	}
}
