package e2e

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// startChromium starts headless Chromium for one test, ended when ctx ends
// or the test does, and returns the context its tab is driven in.
func startChromium(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	chromium, err := testenv.Chromium()
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(chromium), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000)}
	for name, v := range testenv.ChromiumFlags() {
		opts = append(opts, chromedp.Flag(name, v))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// The browser's first run starts it, and lives as long as bctx: no
	// deadline on it. What follows is bounded by ctx.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	stop := context.AfterFunc(ctx, cancelBrowser)
	t.Cleanup(func() { stop() })
	return bctx
}

// consoleDrawsTrace opens the console's page of tr in headless Chromium,
// signed in as an operator, and checks that it draws the trace Jaeger has:
// every span (as many rows, at least: more may have arrived since), every
// service, in tree order (each span after its parent). The top of the page
// is kept as a screenshot, in $CONCLAVE_E2E_SCREENSHOTS or else in
// conclave-e2e-screenshots under the temporary directory.
func consoleDrawsTrace(t *testing.T, ctx context.Context, sh *shape, tr *testenv.JaegerTrace) {
	bctx := startChromium(t, ctx)
	page := sh.console + "/traces/" + tr.TraceID
	if err := chromedp.Do(bctx, chromedp.Navigate(sh.console+"/signin?next="+url.QueryEscape("/traces/"+tr.TraceID)),
		chromedp.SendKeys(`#runner_token`, sh.consoleToken), chromedp.Click(`#signin`), chromedp.WaitVisible(`#waterfall`)); err != nil {
		t.Fatalf("open %s: %v", page, err)
	}
	type row struct {
		Service string `json:"service"`
		Span    string `json:"span"`
	}
	rows, err := chromedp.Run(bctx, chromedp.Evaluate[[]row](`[...document.querySelectorAll('#waterfall tr.span')].map(r => ({service: r.dataset.service, span: r.dataset.span}))`))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < len(tr.Spans) {
		t.Errorf("the console draws %d spans; Jaeger had %d", len(rows), len(tr.Spans))
	}
	drawn := map[string]int{}
	for i, row := range rows {
		drawn[row.Span] = i
	}
	for _, sp := range tr.Spans {
		at, ok := drawn[sp.SpanID]
		switch {
		case !ok:
			t.Errorf("span %s (%s of %s) is not drawn", sp.SpanID, sp.OperationName, sp.ServiceName)
		case rows[at].Service != sp.ServiceName:
			t.Errorf("span %s is drawn as %s's; Jaeger says %s's", sp.SpanID, rows[at].Service, sp.ServiceName)
		}
		if parent, ok := drawn[sp.ParentSpanID]; ok && parent >= at {
			t.Errorf("span %s is drawn before its parent %s", sp.SpanID, sp.ParentSpanID)
		}
	}
	t.Logf("the console draws trace %s: %d spans of %v", tr.TraceID, len(rows), sh.services(tr))
	dir := os.Getenv("CONCLAVE_E2E_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "conclave-e2e-screenshots")
	}
	// The viewport: the summary and the first spans, of every service.
	png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, sh.name+"-trace.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// approveOnReviewPage opens a request's review page in headless Chromium,
// as a reviewer does, signs in with the shape's reviewer token when the
// page asks for one, and approves the request with comment. Every request
// the browser makes carries ctx's trace context (a traceparent header), so
// the decision is in the step's trace.
func (r *stepRun) approveOnReviewPage(ctx context.Context, reviewURL, comment string) {
	r.t.Helper()
	bctx := startChromium(r.t, r.ctx)

	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	headers := network.Headers{}
	for k, v := range carrier {
		headers[k] = v
	}
	traced := func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: headers})
		return chromedp.Void{}, err
	}
	text := func(sel string) string {
		r.t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Text(sel))
		if err != nil {
			r.t.Fatalf("review page %s: %v", sel, err)
		}
		return v
	}
	if err := chromedp.Do(bctx, traced, chromedp.Navigate(reviewURL), chromedp.WaitReady("body")); err != nil {
		r.t.Fatalf("open %s: %v", reviewURL, err)
	}
	if here, err := chromedp.Run(bctx, chromedp.Location()); err != nil {
		r.t.Fatal(err)
	} else if strings.Contains(here, "/review/signin") {
		if err := chromedp.Do(bctx, chromedp.SendKeys(`#token`, r.sh.reviewerToken), chromedp.Click(`#signin`)); err != nil {
			r.t.Fatalf("sign in: %v", err)
		}
	}
	if err := chromedp.Do(bctx, chromedp.WaitVisible(`#decide`)); err != nil {
		r.t.Fatalf("the review page shows no decision form: %v", err)
	}
	if status := text(`#status`); !strings.EqualFold(status, "escalated") {
		r.t.Fatalf("the review page shows status %q", status)
	}
	if err := chromedp.Do(bctx, chromedp.SendKeys(`#comment`, comment), chromedp.Click(`#approve`), chromedp.WaitVisible(`#done`)); err != nil {
		r.t.Fatalf("approve: %v", err)
	}
	if status := text(`#status`); !strings.EqualFold(status, "approved") {
		r.t.Fatalf("status after approving on the review page: %q", status)
	}
}
