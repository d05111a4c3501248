package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/conclave-ai/conclave/functions/librarian/internal/graph"
	"github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	eventsv1 "github.com/conclave-ai/conclave/proto/conclave/events/v1"
	librarianv1 "github.com/conclave-ai/conclave/proto/conclave/librarian/v1"
)

// The real parts: the bootstrap binary, dynalite and fauxqs.
var (
	bootstrap        string
	dynalite, fauxqs *testenv.Component
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if !testing.Short() {
		dir, err := os.MkdirTemp("", "librarian-bootstrap")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bootstrap = filepath.Join(dir, "bootstrap")
		if err := testenv.GoBuild(context.Background(), bootstrap, "./functions/librarian"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ctx := context.Background()
		if dynalite, err = testenv.Dynalite(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer dynalite.Stop()
		if fauxqs, err = testenv.Fauxqs(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer fauxqs.Stop()
	}
	return m.Run()
}

const claudeToken = "claude-3-sam-local-token-0123"

var prefixSeq atomic.Int64

// deployment creates what infra/ creates for one function: its tables in
// dynalite (with a seed graph) and its queue in fauxqs, and returns the
// function's environment.
func deployment(t *testing.T) ([]string, store.Store, queue.Queue, string) {
	t.Helper()
	ctx := context.Background()
	prefix := fmt.Sprintf("rt%d-%d-", time.Now().UnixNano()%1e6, prefixSeq.Add(1))
	st := store.NewDynamo(testenv.DynamoDBClient(dynalite.Endpoint), store.DynamoOptions{TablePrefix: prefix, Endpoint: dynalite.Endpoint})
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	g := graph.New(st)
	for _, n := range []graph.Node{{ID: "arch-001", Type: "architecture", Title: "Architecture overview"}, {ID: "req-045", Type: "docs", Title: "Requirements"}} {
		if err := g.Put(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	q := queue.NewSQS(testenv.AWSConfig(), fauxqs.Endpoint)
	for _, d := range service.Queues(service.Config{}) {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	return []string{
		"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT=" + dynalite.Endpoint, "CONCLAVE_LIBRARIAN_QUEUE_ENDPOINT=" + fauxqs.Endpoint,
		"CONCLAVE_TABLE_PREFIX=" + prefix, "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1",
		"CONCLAVE_LIBRARIAN_AGENT_TOKENS=claude-3=" + claudeToken, "CONCLAVE_LOG_LEVEL=warn",
		// Nothing of the developer's environment may leak in.
		"OTEL_EXPORTER_OTLP_ENDPOINT=", "AWS_PROFILE=", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null",
	}, st, q, prefix
}

func startFunction(t *testing.T, env []string) *testenv.LambdaRuntime {
	t.Helper()
	rt, err := testenv.StartLambda(bootstrap, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Stop)
	return rt
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("events", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBootstrapUnderTheRuntimeAPI runs the real binary as Lambda does,
// feeds it API Gateway events (the sam-local fixtures in events/) and
// checks its answers, its state in dynalite and its events in fauxqs.
func TestBootstrapUnderTheRuntimeAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary against dynalite and fauxqs")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, _, q, _ := deployment(t)
	rt := startFunction(t, env)
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}

	// Payload 2.0: the protocol's approval.
	res, err := rt.Invoke(ctx, fixture(t, "request-approval.json"), map[string]string{"Lambda-Runtime-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"})
	if err != nil {
		t.Fatal(err)
	}
	var v2 events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(res.Payload, &v2); err != nil || v2.StatusCode != 200 || v2.IsBase64Encoded {
		t.Fatalf("v2 response %s (%v), error %s\n%s", res.Payload, err, res.Error, rt.Output())
	}
	var resp librarianv1.LibrarianResponse
	if err := protojson.Unmarshal([]byte(v2.Body), &resp); err != nil || resp.Status != "approved" || resp.GetApprovedLocation() != "docs/design/new-feature.md" {
		t.Fatalf("decision %s (%v)", v2.Body, err)
	}

	// Payload 1.0 (REST API) is served too, in its own response format.
	res, err = rt.Invoke(ctx, fixture(t, "capabilities-rest-v1.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var v1 events.APIGatewayProxyResponse
	if err := json.Unmarshal(res.Payload, &v1); err != nil || v1.StatusCode != 200 || !strings.Contains(v1.Body, `"agent_id":"claude-3"`) ||
		v1.MultiValueHeaders["Content-Type"][0] != "application/json" {
		t.Fatalf("v1 response %s (%v)", res.Payload, err)
	}

	// Bad input is a 400 with a JSON body, not a function error.
	res, err = rt.Invoke(ctx, fixture(t, "request-malformed.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(res.Payload, &v2); err != nil || v2.StatusCode != 400 || !strings.Contains(v2.Body, "malformed_json") {
		t.Fatalf("malformed body: %s %s", res.Payload, res.Error)
	}

	// An event that is not from API Gateway is a function error.
	res, err = rt.Invoke(ctx, []byte(`{"detail-type":"Scheduled Event"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Error) == 0 || !strings.Contains(string(res.Error), "not an API Gateway proxy event") {
		t.Fatalf("a scheduled event: payload %s error %s", res.Payload, res.Error)
	}

	// The submitted and approved events reached SQS, with the trace context
	// API Gateway sent.
	var got []*eventsv1.Envelope
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		msgs, err := q.Receive(ctx, service.EventsQueue.Name, queue.ReceiveOptions{Max: 10, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			env := &eventsv1.Envelope{}
			if err := protojson.Unmarshal(m.Body, env); err != nil {
				t.Fatal(err)
			}
			if env.GetSubjectIds()["request_id"] == resp.RequestId {
				got = append(got, env)
			}
			_ = q.Delete(ctx, service.EventsQueue.Name, m.ReceiptHandle)
		}
	}
	types := []string{}
	for _, e := range got {
		types = append(types, e.Type)
		if !strings.Contains(e.GetTraceContext().GetTraceparent(), "4bf92f3577b34da6a3ce929d0e0e4736") {
			t.Fatalf("event %s does not continue the API Gateway trace: %v", e.Type, e.GetTraceContext())
		}
	}
	if !slices.Equal(types, []string{"librarian.request.submitted", "librarian.request.approved"}) {
		t.Fatalf("events %v\n%s", types, rt.Output())
	}
}

// TestBootstrapBehindAPIGateway serves the real bootstrap over HTTP
// through testenv.APIGateway, as the end-to-end scenario does: an agent's
// request and the review page's sign-in (a redirect, a form, a cookie)
// work as they do behind API Gateway.
func TestBootstrapBehindAPIGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary against dynalite and fauxqs")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, _, _, _ := deployment(t)
	const reviewerToken = "alice-review-token-0123456789"
	// An http:// base URL: the session cookie is not Secure, so that the
	// test's client sends it back over plain HTTP.
	rt := startFunction(t, append(slices.Clone(env), "CONCLAVE_LIBRARIAN_REVIEWER_TOKENS=alice="+reviewerToken,
		"CONCLAVE_LIBRARIAN_BASE_URL=http://127.0.0.1"))
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(testenv.APIGateway(rt))
	defer srv.Close()

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/agent/capabilities", nil)
	req.Header.Set("Authorization", "Bearer "+claudeToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"agent_id":"claude-3"`) {
		t.Fatalf("capabilities: %d %v %s\n%s", resp.StatusCode, resp.Header, body, rt.Output())
	}

	// The review page: a redirect to sign in, then a session cookie.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = browser.Get(srv.URL + "/review")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/review/signin") {
		t.Fatalf("/review without a session: %d %v", resp.StatusCode, resp.Header)
	}
	resp, err = browser.Get(srv.URL + "/review/signin")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `id="token"`) {
		t.Fatalf("the sign-in page: %d %s", resp.StatusCode, page)
	}
	resp, err = browser.PostForm(srv.URL+"/review/signin", url.Values{"token": {reviewerToken}, "next": {"/review"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) == 0 {
		t.Fatalf("sign-in: %d %v", resp.StatusCode, resp.Header)
	}
	resp, err = browser.Get(srv.URL + "/review")
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "alice") {
		t.Fatalf("/review signed in: %d %s", resp.StatusCode, page)
	}
}

// TestInitErrorsReachTheRuntimeAPI: a bad configuration fails the cold
// start, and the reason arrives at /init/error naming what to fix.
func TestInitErrorsReachTheRuntimeAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary")
	}
	t.Parallel()
	env, _, _, _ := deployment(t)
	badDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(badDir, "agents.yaml"), []byte("agents:\n  claude-3:\n    type: x\n    capabilities: [fly]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(badDir, "protocol.yaml"), mustRead(t, "config/protocol.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, setting, want string
	}{
		{"bad agents.yaml", "CONCLAVE_LIBRARIAN_CONFIG_DIR=" + badDir, badDir + "/agents.yaml: agents.claude-3.capabilities"},
		{"embedded backend", "CONCLAVE_BACKEND=embedded", "CONCLAVE_BACKEND"},
		{"bad API rate", "CONCLAVE_LIBRARIAN_API_RATE=lots", "CONCLAVE_LIBRARIAN_API_RATE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rt := startFunction(t, append(slices.Clone(env), tt.setting))
			body, err := rt.InitError(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var report struct {
				ErrorMessage string `json:"errorMessage"`
				ErrorType    string `json:"errorType"`
			}
			if err := json.Unmarshal(body, &report); err != nil || report.ErrorType != "Runtime.InitError" || !strings.Contains(report.ErrorMessage, tt.want) {
				t.Fatalf("init error %s, want it to name %q", body, tt.want)
			}
			select {
			case <-rt.Exited():
			case <-ctx.Done():
				t.Fatal("the function kept running after its init error")
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInitMakesNoNetworkCall: the cold start reaches /next without
// touching DynamoDB or SQS; the first invocation is what connects.
func TestInitMakesNoNetworkCall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var dials atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				dials.Add(1)
				_ = c.Close()
			}
		}
	}()
	env, _, _, _ := deployment(t)
	watched := "http://" + l.Addr().String()
	env = append(env, "CONCLAVE_AWS_ENDPOINT="+watched, "CONCLAVE_LIBRARIAN_QUEUE_ENDPOINT="+watched)
	rt := startFunction(t, env)
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("init connected to the AWS endpoint %d times", n)
	}
	// The first request does reach it (and fails over to a 503, since the
	// endpoint hangs up): the watch sees real traffic.
	res, err := rt.Invoke(ctx, fixture(t, "request-approval.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var v2 events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(res.Payload, &v2); err != nil || v2.StatusCode != 503 || dials.Load() == 0 {
		t.Fatalf("response %s, %d dials", res.Payload, dials.Load())
	}
}

// TestTraceInJaeger: an invocation continues the trace API Gateway sent in
// traceparent, with otellambda's span, the handler's, and otelaws' spans of
// the DynamoDB and SQS calls, all in one trace in a real Jaeger.
func TestTraceInJaeger(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the bootstrap binary and Jaeger")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	jaeger, err := testenv.StartJaeger(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer jaeger.Stop()
	env, _, _, _ := deployment(t)
	rt := startFunction(t, append(env, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+jaeger.OTLPHTTPEndpoint, "OTEL_EXPORTER_OTLP_INSECURE=true",
		"AWS_LAMBDA_FUNCTION_NAME=librarian"))
	if err := rt.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Invoke(ctx, fixture(t, "request-approval.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(res.Payload), `"statusCode":200`) {
		t.Fatalf("invocation: %s %s", res.Payload, res.Error)
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736" // events/request-approval.json's traceparent
	var trace *testenv.JaegerTrace
	for {
		trace, err = jaeger.WaitTrace(ctx, traceID, 3)
		if err != nil {
			t.Fatalf("%v\n%s", err, rt.Output())
		}
		if has(trace, "DynamoDB") && has(trace, "SQS") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("spans %v", names(trace))
		case <-time.After(200 * time.Millisecond):
		}
	}
	root := trace.Span("librarian")
	if root == nil || root.ParentSpanID != "00f067aa0ba902b7" || root.ServiceName != "conclave-librarian" {
		t.Fatalf("no otellambda span continuing API Gateway's: %v", names(trace))
	}
}

func has(trace *testenv.JaegerTrace, prefix string) bool {
	for _, s := range trace.Spans {
		if strings.HasPrefix(s.OperationName, prefix) {
			return true
		}
	}
	return false
}

func names(trace *testenv.JaegerTrace) []string {
	var out []string
	for _, s := range trace.Spans {
		out = append(out, s.ServiceName+":"+s.OperationName)
	}
	return out
}
