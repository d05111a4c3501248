package e2e

import (
	"context"
	"strings"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// approveOnReviewPage opens a request's review page in headless Chromium,
// as a reviewer does, signs in with the shape's reviewer token when the
// page asks for one, and approves the request with comment. Every request
// the browser makes carries ctx's trace context (a traceparent header), so
// the decision is in the step's trace.
func (r *stepRun) approveOnReviewPage(ctx context.Context, reviewURL, comment string) {
	r.t.Helper()
	chromium, err := testenv.Chromium()
	if err != nil {
		r.t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(chromium), chromedp.UserDataDir(r.t.TempDir()), chromedp.WindowSize(1280, 1000)}
	for name, v := range testenv.ChromiumFlags() {
		opts = append(opts, chromedp.Flag(name, v))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The browser's first run starts it, and lives as long as bctx: no
	// deadline on it. The steps after are bounded by the step's time.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		r.t.Fatalf("start chromium: %v", err)
	}
	stop := context.AfterFunc(r.ctx, cancelBrowser)
	defer stop()

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
