package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/internal/requests"
	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// holdingProxy forwards AWS API calls to a real endpoint, except that, once
// armed, it holds the first call that matches and never forwards it: the
// function is then caught at that exact step, for the test to kill it.
type holdingProxy struct {
	*httptest.Server
	mu    sync.Mutex
	match func(r *http.Request, body []byte) bool
	held  chan struct{}
	calls [][]byte // every call's body, held or forwarded
}

func newHoldingProxy(t *testing.T, target string) *holdingProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &holdingProxy{}
	forward := httputil.NewSingleHostReverseProxy(u)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.calls = append(p.calls, body)
		match, held := p.match, p.held
		if match != nil && match(r, body) {
			p.match = nil
			p.mu.Unlock()
			close(held)
			<-r.Context().Done() // until the function dies
			return
		}
		p.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// arm holds the next call that match accepts; the returned channel is
// closed when one arrives.
func (p *holdingProxy) arm(match func(r *http.Request, body []byte) bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.match, p.held = match, make(chan struct{})
	return p.held
}

// requestIDs are the request ids the function wrote request items for.
func (p *holdingProxy) requestIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, body := range p.calls {
		for _, m := range requestKey.FindAllSubmatch(body, -1) {
			if id := string(m[1]); !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

var requestKey = regexp.MustCompile(`"req#(req-[a-z2-7]{16})"`)

func awsCall(r *http.Request, operation string) bool {
	return strings.HasSuffix(r.Header.Get("X-Amz-Target"), "."+operation)
}

// withBody is the fixture event with another request body.
func withBody(t *testing.T, fixture []byte, body any) []byte {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal(fixture, &ev); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ev["body"] = string(b)
	out, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func invokeOK(ctx context.Context, t *testing.T, rt *testenv.LambdaRuntime, event []byte) *librarianv1.LibrarianResponse {
	t.Helper()
	res, err := rt.Invoke(ctx, event, nil)
	if err != nil {
		t.Fatal(err)
	}
	var v2 events.APIGatewayV2HTTPResponse
	var resp librarianv1.LibrarianResponse
	if err := json.Unmarshal(res.Payload, &v2); err != nil || v2.StatusCode != 200 {
		t.Fatalf("response %s (%v), error %s\n%s", res.Payload, err, res.Error, rt.Output())
	}
	if err := protojson.Unmarshal([]byte(v2.Body), &resp); err != nil {
		t.Fatal(err)
	}
	return &resp
}

// killMidInvocation invokes a fresh instance with event, kills it with
// SIGKILL once held has fired (the function is inside the step the proxy
// holds), and checks the caller saw the invocation fail.
func killMidInvocation(ctx context.Context, t *testing.T, env []string, event []byte, held <-chan struct{}) {
	t.Helper()
	rt := startFunction(t, env)
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	go func() {
		_, err := rt.Invoke(ctx, event, nil)
		failed <- err
	}()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatalf("the function never reached the held call:\n%s", rt.Output())
	}
	rt.Kill()
	if err := <-failed; err == nil {
		t.Fatal("an invocation killed midway answered")
	}
}

// TestKilledMidInvocation kills the real bootstrap, under the Runtime API,
// in the middle of a request at the two places where a crash could lose or
// double work, and retries as API Gateway's client does, on a fresh
// instance: the request is neither lost nor applied twice.
//
//   - An APPROVAL killed after its decision was stored and before its
//     events were sent: the retry (same request, stamped with its
//     timestamp) answers the stored request rather than deciding a second
//     one, and its staged events go out, once.
//   - A REPORT killed after the request became COMPLETED and before the
//     knowledge graph was written: the same REPORT again writes the node
//     rather than failing with 409, and the completion events go out once.
func TestKilledMidInvocation(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary against dynalite and fauxqs")
	}
	// Not parallel: the tests share fauxqs's events queue (bus-events), and
	// this one checks everything on it.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, st, q, prefix := deployment(t)
	sqs := newHoldingProxy(t, fauxqs.Endpoint)
	dynamo := newHoldingProxy(t, dynalite.Endpoint)
	for i, kv := range env {
		switch {
		case strings.HasPrefix(kv, "CONCLAVE_LIBRARIAN_QUEUE_ENDPOINT="):
			env[i] = "CONCLAVE_LIBRARIAN_QUEUE_ENDPOINT=" + sqs.URL
		case strings.HasPrefix(kv, "CONCLAVE_AWS_ENDPOINT="):
			env[i] = "CONCLAVE_AWS_ENDPOINT=" + dynamo.URL
		}
	}
	approval := map[string]any{"agent_id": "claude-3", "session_id": "sess-crash", "timestamp": "2026-11-23T09:00:00Z",
		"request_type": "APPROVAL", "action": "create", "target_type": "design", "target_path": "docs/design/crash.md",
		"content":   "# Crash Design\n\n## Overview\nWhat.\n\n## Design\nHow.\n\n## Alternatives\nNone.\n",
		"rationale": "Surviving a crash", "references": []string{"arch-001"}}
	approvalEvent := withBody(t, fixture(t, "request-approval.json"), approval)

	// 1. Killed between storing the decision and publishing its events.
	held := sqs.arm(func(r *http.Request, _ []byte) bool {
		return awsCall(r, "SendMessage") || awsCall(r, "SendMessageBatch")
	})
	killMidInvocation(ctx, t, env, approvalEvent, held)

	rt := startFunction(t, env)
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	resp := invokeOK(ctx, t, rt, approvalEvent)
	if resp.Status != "approved" || resp.GetApprovedLocation() != "docs/design/crash.md" {
		t.Fatalf("the retried approval: %v", resp)
	}
	if ids := dynamo.requestIDs(); !slices.Equal(ids, []string{resp.RequestId}) {
		t.Fatalf("request items written for %v, want only the one request %s", ids, resp.RequestId)
	}
	if got := receiveEvents(ctx, t, q, 2); !slices.Equal(got, []string{resp.RequestId + " librarian.request.approved", resp.RequestId + " librarian.request.submitted"}) {
		t.Fatalf("events after the crash and the retry %v, want the one request's submitted and approved, once", got)
	}
	rt.Stop()

	// 2. Killed between completing the request and writing the graph.
	report := map[string]any{"agent_id": "claude-3", "request_type": "REPORT", "request_id": resp.RequestId, "completed": true,
		"changes_made": []string{"docs/design/crash.md"}}
	reportEvent := withBody(t, fixture(t, "request-approval.json"), report)
	graphTable := prefix + graph.Table.Name
	held = dynamo.arm(func(r *http.Request, body []byte) bool {
		return awsCall(r, "PutItem") && bytes.Contains(body, []byte(`"TableName":"`+graphTable+`"`))
	})
	killMidInvocation(ctx, t, env, reportEvent, held)
	g := graph.New(st)
	rec, err := requests.New(st, nil).Get(ctx, resp.RequestId)
	if err != nil || rec.State != "COMPLETED" {
		t.Fatalf("after the crash the request is %v (%v), want COMPLETED: the crash must fall between the two writes", rec.State, err)
	}
	if _, err := g.Get(ctx, resp.GetAssignedId()); !errors.Is(err, graph.ErrNotFound) && !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the crash the graph node exists already (%v): the crash must fall between the two writes", err)
	}

	rt = startFunction(t, env)
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	done := invokeOK(ctx, t, rt, reportEvent)
	if done.RequestId != resp.RequestId {
		t.Fatalf("the retried report: %v", done)
	}
	node, err := g.Get(ctx, resp.GetAssignedId())
	if err != nil || node.Path != "docs/design/crash.md" || node.Title != "Crash Design" {
		t.Fatalf("graph node after the retried report: %+v %v", node, err)
	}
	if got := receiveEvents(ctx, t, q, 2); !slices.Equal(got, []string{resp.RequestId + " librarian.request.completed", resp.RequestId + " librarian.specification.changed"}) {
		t.Fatalf("events after the crash and the retry %v, want completed and specification.changed, once", got)
	}
}

// receiveEvents takes want distinct envelopes off the queue (duplicates of
// an at-least-once delivery are dropped by id, as consumers do), then
// checks that nothing else is on it, and returns "request_id type" of each.
func receiveEvents(ctx context.Context, t *testing.T, q queue.Queue, want int) []string {
	t.Helper()
	seen := map[string]bool{}
	var got []string
	for extraPolls := 0; extraPolls < 2; {
		msgs, err := q.Receive(ctx, service.EventsQueue.Name, queue.ReceiveOptions{Max: 10, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 && len(got) >= want {
			extraPolls++
		}
		if ctx.Err() != nil {
			t.Fatalf("events so far %v", got)
		}
		for _, m := range msgs {
			env := &eventsv1.Envelope{}
			if err := protojson.Unmarshal(m.Body, env); err != nil {
				t.Fatal(err)
			}
			if !seen[env.Id] {
				seen[env.Id] = true
				got = append(got, env.GetSubjectIds()["request_id"]+" "+env.Type)
			}
			_ = q.Delete(ctx, service.EventsQueue.Name, m.ReceiptHandle)
		}
	}
	slices.Sort(got) // a standard queue does not keep order
	return got
}
