package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// backends are the storage backends every governed test runs on.
// backend is a store and queue the governed tests run on: the embedded
// ones, or DynamoDB and SQS (dynalite and fauxqs).
type backend struct {
	name string
	aws  bool
}

var backends = []backend{{"embedded", false}, {"dynalite-fauxqs", true}}

// eachBackend runs test on every backend, each a parallel subtest named
// for it, in parallel with the other tests.
func eachBackend(t *testing.T, test func(t *testing.T, b backend)) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

// unwrapStruct is an event's data as its producer wrote it: the runner's
// payloads are google.protobuf.Struct, which the bus renders as
// {"@type", "value"}.
func unwrapStruct(data map[string]any) map[string]any {
	if v, ok := data["value"].(map[string]any); ok && strings.HasSuffix(fmt.Sprint(data["@type"]), "google.protobuf.Struct") {
		return v
	}
	return data
}

// decided waits for the instance's runner.permission.decided event.
func decided(t *testing.T, msgs <-chan map[string]any) map[string]any {
	t.Helper()
	return unwrapStruct(waitEvent(t, msgs, "runner.permission.decided", 2*time.Minute, nil))
}

// TestGovernedOutcomes: the Librarian approves (the deviation accepted as
// a constraint, which the agent sees in _meta) or rejects the example
// agent's permission request; the agent goes on or skips the change, and
// the decision and its reason are in the instance's log and on its task's
// topic.
func TestGovernedOutcomes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the Librarian, the bus, the runner and node")
	}
	t.Parallel()
	for _, b := range backends {
		for _, tt := range []struct {
			name      string
			protocol  map[string]string
			decision  string
			logHas    []string
			agentSays string
		}{
			{"approved", approveDeviations, "approved", []string{`permission for "` + governedTitle + `": approved; constraints: `, "outside_workspace"}, agentAllowed},
			{"rejected", rejectDeviations, "rejected", []string{`permission for "` + governedTitle + `": rejected: refused: `, "deviations_not_allowed"}, agentRefused},
		} {
			t.Run(b.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				e := startGoverned(t, governedOptions{aws: b.aws, protocol: tt.protocol})
				task := "task-governed-" + tt.name + "-" + b.name
				msgs := e.busMessages(t, "task:"+task)
				in := e.launch(t, task)
				done := e.waitStatus(t, in.ID, 3*time.Minute, "completed", "failed", "stopped")
				log := e.logText(t, in.ID)
				if done.Status != "completed" || !strings.Contains(log, tt.agentSays) {
					t.Fatalf("status %+v; the agent did not say %q; log:\n%s", done, tt.agentSays, log)
				}
				for _, want := range append(tt.logHas, "permission requested: \""+governedTitle+"\" (modify code); asking the Librarian") {
					if !strings.Contains(log, want) {
						t.Errorf("the log lacks %q:\n%s", want, log)
					}
				}
				ev := decided(t, msgs)
				if ev["decision"] != tt.decision || ev["instance_id"] != in.ID || ev["tool_call_id"] != "call_2" || ev["request_id"] == "" {
					t.Errorf("runner.permission.decided %v", ev)
				}
				if tt.decision == "approved" && ev["constraints"] == nil || tt.decision == "rejected" && !strings.Contains(fmt.Sprint(ev["reason"]), "deviations_not_allowed") {
					t.Errorf("runner.permission.decided %v", ev)
				}
				if m := e.metrics(t); !strings.Contains(m, `conclave_runner_permission_requests_total{`) || !strings.Contains(m, `outcome="`+tt.decision+`"`) {
					t.Errorf("permission_requests_total{outcome=%q} not counted:\n%s", tt.decision, grepLines(m, "permission"))
				}
			})
		}
	}
}

// TestGovernedEscalationDecidedInChromium: the Librarian escalates the
// request; the instance is awaiting_approval with the review's URL, on its
// status and its task's topic; a person approves it on the review page in
// headless Chromium; the decision reaches the waiting turn through the
// bus, and the agent goes on.
func TestGovernedEscalationDecidedInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the Librarian, the bus, the runner, node and Chromium")
	}
	eachBackend(t, func(t *testing.T, b backend) {
		e := startGoverned(t, governedOptions{aws: b.aws, protocol: escalateDeviation})
		task := "task-governed-escalated-" + b.name
		msgs := e.busMessages(t, "task:"+task)
		in := e.launch(t, task)
		waiting := e.waitStatus(t, in.ID, 3*time.Minute, "awaiting_approval", "completed", "failed")
		if waiting.Status != "awaiting_approval" || !strings.HasPrefix(waiting.ReviewURL, e.librarianURL+"/review/") {
			t.Fatalf("status %+v; log:\n%s", waiting, e.logText(t, in.ID))
		}
		ev := unwrapStruct(waitEvent(t, msgs, "runner.task.status_changed", time.Minute, func(d map[string]any) bool {
			return unwrapStruct(d)["status"] == "awaiting_approval"
		}))
		if ev["review_url"] != waiting.ReviewURL || ev["approval_request_id"] == "" {
			t.Errorf("the awaiting_approval event %v", ev)
		}
		reviewInChromium(t, waiting.ReviewURL, "approve", "The config change is fine.", b.name)
		done := e.waitStatus(t, in.ID, 2*time.Minute, "completed", "failed", "stopped")
		log := e.logText(t, in.ID)
		if done.Status != "completed" || done.ReviewURL != "" || !strings.Contains(log, agentAllowed) {
			t.Fatalf("status %+v; log:\n%s", done, log)
		}
		for _, want := range []string{"escalated to a person", "review: " + waiting.ReviewURL, "the decision came by the bus", "status: running"} {
			if !strings.Contains(log, want) {
				t.Errorf("the log lacks %q:\n%s", want, log)
			}
		}
		if d := decided(t, msgs); d["decision"] != "approved" || d["escalated"] != true || !strings.Contains(fmt.Sprint(d["reason"]), "alice") {
			t.Errorf("runner.permission.decided %v", d)
		}
		if m := e.metrics(t); !strings.Contains(m, `conclave_runner_approval_wait_seconds_count{`) {
			t.Errorf("approval_wait_seconds not recorded:\n%s", grepLines(m, "approval"))
		}
	})
}

// reviewInChromium signs in on the review page as the reviewer and
// decides, keeping a screenshot.
func reviewInChromium(t *testing.T, reviewURL, decision, comment, shot string) {
	t.Helper()
	bin, err := testenv.Chromium()
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{chromedp.ExecPath(bin), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000)}
	for name, v := range testenv.ChromiumFlags() {
		opts = append(opts, chromedp.Flag(name, v))
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()
	if err := chromedp.Do(ctx, chromedp.Navigate(reviewURL), chromedp.WaitVisible(`#token`),
		chromedp.SendKeys(`#token`, reviewerLibToken), chromedp.Click(`#signin`), chromedp.WaitVisible(`#decide`)); err != nil {
		t.Fatalf("signing in on the review page: %v", err)
	}
	content, err := chromedp.Run(ctx, chromedp.Text(`#content`))
	if err != nil || !strings.Contains(content, governedTitle) || !strings.Contains(content, "runner instance") {
		t.Fatalf("the review page shows %q (%v)", content, err)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(`#comment`, comment), chromedp.Click(`#`+decision), chromedp.WaitVisible(`#done`)); err != nil {
		t.Fatalf("deciding: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", ".artifacts", "governed")
	if a := os.Getenv("CONCLAVE_TEST_ARTIFACTS"); a != "" {
		dir = filepath.Join(a, "governed")
	}
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "review-"+shot+".png"), png, 0o644)
	}
}

// TestGovernedEscalationTimeout: an escalation no one decides is refused,
// at the type's approval_timeout, or at the Librarian's own
// timeouts.escalation (which it rejects, with its reason); the instance
// says why, and the agent skips the change.
func TestGovernedEscalationTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the Librarian, the bus, the runner and node")
	}
	t.Parallel()
	withLibrarianTimeout := map[string]string{"escalation: 86400000ms": "escalation: 3000ms"}
	for k, v := range escalateDeviation {
		withLibrarianTimeout[k] = v
	}
	for _, b := range backends {
		for _, tt := range []struct {
			name      string
			protocol  map[string]string
			typeExtra string
			logHas    []string
		}{
			{"approval_timeout", escalateDeviation, "    approval_timeout: 2s\n", []string{": timeout: refused: no one decided within the time allowed"}},
			{"timeouts.escalation", withLibrarianTimeout, "", []string{": rejected", "escalation_timeout"}},
		} {
			t.Run(b.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				e := startGoverned(t, governedOptions{aws: b.aws, protocol: tt.protocol, typeExtra: tt.typeExtra})
				in := e.launch(t, "task-governed-timeout-"+tt.name+"-"+b.name)
				e.waitLog(t, in.ID, "escalated to a person", 3*time.Minute)
				done := e.waitStatus(t, in.ID, 2*time.Minute, "completed", "failed", "stopped")
				log := e.logText(t, in.ID)
				if done.Status != "completed" || !strings.Contains(log, agentRefused) {
					t.Fatalf("status %+v; log:\n%s", done, log)
				}
				for _, want := range tt.logHas {
					if !strings.Contains(log, want) {
						t.Errorf("the log lacks %q:\n%s", want, log)
					}
				}
			})
		}
	}
}

// TestGovernedLibrarianDown: with the Librarian unreachable, the runner
// fails closed: the request is refused, the log and the task's topic say
// why, and the metric counts it.
func TestGovernedLibrarianDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bus, the runner and node")
	}
	eachBackend(t, func(t *testing.T, b backend) {
		e := startGoverned(t, governedOptions{aws: b.aws, librarianURL: "http://127.0.0.1:1"})
		task := "task-governed-down-" + b.name
		msgs := e.busMessages(t, "task:"+task)
		in := e.launch(t, task)
		done := e.waitStatus(t, in.ID, 3*time.Minute, "completed", "failed", "stopped")
		log := e.logText(t, in.ID)
		if done.Status != "completed" || !strings.Contains(log, agentRefused) || !strings.Contains(log, "unavailable (failing closed: refused)") ||
			!strings.Contains(log, "the Librarian is unavailable") {
			t.Fatalf("status %+v; log:\n%s", done, log)
		}
		if d := decided(t, msgs); d["decision"] != "unavailable" || d["failed_closed"] != true || !strings.Contains(fmt.Sprint(d["reason"]), "connection refused") {
			t.Errorf("runner.permission.decided %v", d)
		}
		metrics := e.metrics(t)
		if !strings.Contains(metrics, `conclave_runner_permission_fail_closed_total{`) || !strings.Contains(metrics, `reason="unavailable"`) {
			t.Errorf("no fail-closed denial counted:\n%s", grepLines(metrics, "permission"))
		}
	})
}

func grepLines(text, word string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
