package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	libconfig "github.com/conclave-ai/conclave/functions/librarian/config"
	librarian "github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/storage"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/telemetry"
	"github.com/conclave-ai/conclave/pkg/testenv"
	bus "github.com/conclave-ai/conclave/services/bus/service"
	runner "github.com/conclave-ai/conclave/services/runner/service"
)

// The governed tests run the Librarian, the bus and the runner, each on a
// loopback listener of its own, over one storage backend (the embedded
// store and queue, or dynalite and fauxqs), with the tokens production
// has: the runner asks the Librarian over HTTP as its agent type, and
// hears its decisions on the bus. The agent is the example agent of
// @agentclientprotocol/sdk, which asks permission to edit
// /home/user/project/config.json (outside its workspace, which the runner
// declares as a deviation); the Librarian's protocol.yaml decides what
// becomes of it.

const (
	governedType     = "npm-governed"
	runnerLibToken   = "lib-runner-npm-governed-0123456789"
	reviewerLibToken = "lib-reviewer-alice-0123456789abcd"
	runnerBusToken   = "bus-runner-0123456789abcdef0123"
	bridgeAgent      = "conclave-bridge"
	bridgeLibToken   = "lib-bridge-0123456789abcdef0123"
	bridgeBusToken   = "bus-bridge-0123456789abcdef0123"
	adminBusToken    = "bus-admin-0123456789abcdef01234"
	// The example agent's permission request.
	governedTitle = "Modifying critical configuration file"
	// What it says once allowed, and once refused.
	agentAllowed = "I've successfully updated the configuration"
	agentRefused = "I understand you prefer not to make that change"
)

// Librarian compliance settings that decide the example agent's request:
// its edit outside the workspace is a deviation, and its target is not in
// the knowledge graph.
var (
	approveDeviations = map[string]string{"strict_mode: true": "strict_mode: false", "allow_deviations: false": "allow_deviations: true"}
	rejectDeviations  = map[string]string{}
	escalateDeviation = map[string]string{"strict_mode: true": "strict_mode: false"}
)

type governedOptions struct {
	// aws runs on dynalite and fauxqs; otherwise the embedded backend.
	aws bool
	// protocol replaces text in the built-in protocol.yaml (besides
	// require_known_targets: false, always set).
	protocol map[string]string
	// typeExtra is YAML added to the agent type (approval_timeout).
	typeExtra string
	// librarianURL, when set, is where the runner looks for the Librarian
	// (a dead address: it is down).
	librarianURL string
	// runnerProcess: the test runs the runner itself (a process it can
	// kill), and the env only the Librarian and the bus.
	runnerProcess bool
	// telemetry, when set, gives each service its provider (Jaeger's).
	telemetry func(service string) *telemetry.Provider
}

// governedEnv is the three services of a governed test.
type governedEnv struct {
	t                  *testing.T
	lib                *librarian.Service
	busSvc             *bus.Bus
	librarianURL       string
	busURL             string
	runnerURL          string
	root, dataDir      string
	typesFile          string
	storage            config.Storage
	runnerLibrarianURL string
	tel                *telemetry.Provider
}

// governedTypes writes the runner's agent types file.
func governedTypes(t *testing.T, extra string) string {
	t.Helper()
	root, _ := filepath.Abs("../..")
	node := filepath.Join(root, "node_modules", ".bin", "node")
	agent := filepath.Join(root, "node_modules", "@agentclientprotocol", "sdk", "dist", "examples", "agent.js")
	yaml := fmt.Sprintf("agent_types:\n  - id: %s\n    name: the example agent of @agentclientprotocol/sdk, governed\n    command: [%q, %q]\n    protocol: acp\n    permission: librarian\n    enabled: true\n    timeout: 5m\n%s",
		governedType, node, agent, extra)
	path := filepath.Join(t.TempDir(), "agent-types.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// librarianConfig writes agents.yaml (the built-in registry and the
// runner's agent type, as an operator registers it) and protocol.yaml.
func librarianConfig(t *testing.T, replace map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	agents, _ := libconfig.Files.ReadFile("agents.yaml")
	for _, id := range []string{governedType, bridgeAgent} {
		agents = append(agents, []byte(fmt.Sprintf("\n  %s:\n    type: runner-agent\n    capabilities: [read, write, analyze]\n    rate_limit: 1000/hour\n    allowed_targets: [all]\n", id))...)
	}
	proto, _ := libconfig.Files.ReadFile("protocol.yaml")
	text := string(proto)
	for old, repl := range replace {
		if !strings.Contains(text, old) {
			t.Fatalf("protocol.yaml has no %q", old)
		}
		text = strings.Replace(text, old, repl, 1)
	}
	text = strings.Replace(text, "    enforce_references: true\n", "    enforce_references: true\n    require_known_targets: false\n", 1)
	for name, data := range map[string][]byte{"agents.yaml": agents, "protocol.yaml": []byte(text)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// loadConfig loads a service's configuration from env as its deployable
// would, with its defaults.
func loadConfig[T any](t *testing.T, env map[string]string) T {
	t.Helper()
	var cfg struct {
		Common  config.Common
		Storage config.Storage
		Service T
	}
	if err := config.Load(context.Background(), &cfg, "test", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard); err != nil {
		t.Fatal(err)
	}
	return cfg.Service
}

func testLogger(t *testing.T, name string) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})).With("service", name)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startGoverned starts the Librarian and the bus (and, unless the test
// runs it, the runner) for t.
func startGoverned(t *testing.T, o governedOptions) *governedEnv {
	t.Helper()
	ctx := context.Background()
	e := &governedEnv{t: t, dataDir: t.TempDir()}
	e.root = filepath.Join(e.dataDir, "workspaces")
	if err := os.MkdirAll(e.root, 0o755); err != nil {
		t.Fatal(err)
	}
	e.storage = config.Storage{Backend: config.BackendEmbedded, DataDir: e.dataDir, AWSRegion: "us-east-1"}
	if o.aws {
		aws := testenv.StartAWS(t, ctx)
		srv := httptest.NewServer(aws.Endpoint)
		t.Cleanup(srv.Close)
		e.storage = config.Storage{Backend: config.BackendAWS, AWSEndpoint: srv.URL, AWSRegion: "us-east-1"}
	}
	st, err := storage.OpenStore(ctx, e.storage)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	q, err := storage.OpenQueue(ctx, e.storage)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	if err := store.EnsureTables(ctx, st, append(librarian.Tables, bus.Tables...)...); err != nil {
		t.Fatal(err)
	}
	if err := queue.EnsureAll(ctx, q, slices.Concat(bus.Queues(bus.Config{}), librarian.Queues(librarian.Config{}))...); err != nil {
		t.Fatal(err)
	}
	tel, err := telemetry.New(ctx, telemetry.Config{ServiceName: "governed-test"})
	if err != nil {
		t.Fatal(err)
	}
	e.tel = tel
	telOf := func(string) *telemetry.Provider { return tel }
	if o.telemetry != nil {
		telOf = o.telemetry
	}

	libCfg := loadConfig[librarian.Config](t, map[string]string{
		"CONCLAVE_LIBRARIAN_HTTP_ADDR":       "127.0.0.1:0",
		"CONCLAVE_LIBRARIAN_CONFIG_DIR":      librarianConfig(t, o.protocol),
		"CONCLAVE_LIBRARIAN_AGENT_TOKENS":    governedType + "=" + runnerLibToken + "," + bridgeAgent + "=" + bridgeLibToken,
		"CONCLAVE_LIBRARIAN_REVIEWER_TOKENS": "alice=" + reviewerLibToken,
		"CONCLAVE_LIBRARIAN_SWEEP_INTERVAL":  "200ms",
	})
	e.lib, err = librarian.New(libCfg, librarian.Deps{Store: st, Queue: q, Logger: testLogger(t, "librarian"), Telemetry: telOf("librarian")})
	if err != nil {
		t.Fatal(err)
	}
	grants, _ := json.Marshal([]map[string]any{
		{"token": runnerBusToken, "subscribe": []string{"system:librarian.*"}},
		{"token": bridgeBusToken, "subscribe": []string{"system:librarian.request.*"}},
		{"token": adminBusToken, "publish": []string{"*"}, "subscribe": []string{"*"}, "admin": true},
	})
	busCfg := loadConfig[bus.Config](t, map[string]string{
		"CONCLAVE_BUS_ADDR": "127.0.0.1:0", "CONCLAVE_BUS_SERVER_ID": "governed", "CONCLAVE_BUS_GRANTS": string(grants),
	})
	e.busSvc, err = bus.New(busCfg, bus.Deps{Store: st, Queue: q, Logger: testLogger(t, "bus"), Telemetry: telOf("bus")})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, s := range []service{e.lib, e.busSvc} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.Run(runCtx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, s := range []service{e.lib, e.busSvc} {
		select {
		case <-s.Ready():
		case <-time.After(time.Minute):
			t.Fatal("the Librarian or the bus did not start within a minute")
		}
	}
	e.librarianURL, e.busURL = readyURL(e.lib, "http://", "HTTP"), readyURL(e.busSvc, "ws://", "WebSocket")
	e.runnerLibrarianURL = e.librarianURL
	if o.librarianURL != "" {
		e.runnerLibrarianURL = o.librarianURL
	}
	e.typesFile = governedTypes(t, o.typeExtra)
	if o.runnerProcess {
		return e
	}
	if err := store.EnsureTables(ctx, st, runner.Tables...); err != nil {
		t.Fatal(err)
	}
	rcfg := loadConfig[runner.Config](t, e.runnerEnv())
	for _, d := range runner.Queues(rcfg) {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	rn, err := runner.New(rcfg, runner.Deps{Store: st, Queue: q, Logger: testLogger(t, "runner"), Telemetry: telOf("runner")})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = rn.Run(runCtx) }()
	<-rn.Ready()
	e.runnerURL = readyURL(rn, "http://", "HTTP")
	return e
}

// runnerEnv is the runner's settings, as its deployable takes them.
func (e *governedEnv) runnerEnv() map[string]string {
	return map[string]string{
		"CONCLAVE_RUNNER_GRPC_ADDR": "127.0.0.1:0", "CONCLAVE_RUNNER_HTTP_ADDR": "127.0.0.1:0",
		"CONCLAVE_RUNNER_SERVER_ID": "governed", "CONCLAVE_RUNNER_ALLOW_UNAUTHENTICATED": "true",
		"CONCLAVE_RUNNER_WORKSPACE_ROOTS": e.root, "CONCLAVE_RUNNER_AGENT_TYPES": e.typesFile,
		// node starts slowly on a busy machine.
		"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT": "30s", "CONCLAVE_RUNNER_LAUNCH_RETRY": "2s",
		"CONCLAVE_RUNNER_CLIENT_RATE": "1000000", "CONCLAVE_RUNNER_CLIENT_BURST": "1000000",
		"CONCLAVE_RUNNER_LIBRARIAN_URL":    e.runnerLibrarianURL,
		"CONCLAVE_RUNNER_LIBRARIAN_TOKENS": governedType + "=" + runnerLibToken,
		"CONCLAVE_RUNNER_BUS_URL":          e.busURL, "CONCLAVE_RUNNER_BUS_TOKEN": runnerBusToken,
	}
}

// call sends a JSON request to base+path with a bearer token and decodes
// the answer into out; it returns the status.
func call(t *testing.T, method, url, token string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: HTTP %d %s: %v", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

type governedInstance struct {
	ID        string `json:"id"`
	TaskID    string `json:"task_id"`
	Status    string `json:"status"`
	ReviewURL string `json:"review_url"`
	Error     string `json:"error"`
}

// launch starts the governed agent type in a workspace of its own.
func (e *governedEnv) launch(t *testing.T, taskID string) governedInstance {
	t.Helper()
	ws, err := os.MkdirTemp(e.root, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	var in governedInstance
	if code := call(t, "POST", e.runnerURL+"/api/v1/agents/launch", "", map[string]any{"task_id": taskID, "agent_type": governedType,
		"workspace_path": ws, "env": map[string]string{"TASK_DESCRIPTION": "improve the config"}}, &in); code != http.StatusOK {
		t.Fatalf("launch: HTTP %d %+v", code, in)
	}
	return in
}

func (e *governedEnv) status(t *testing.T, id string) governedInstance {
	t.Helper()
	var in governedInstance
	if code := call(t, "GET", e.runnerURL+"/api/v1/agents/"+id+"/status", "", nil, &in); code != http.StatusOK {
		t.Fatalf("status: HTTP %d", code)
	}
	return in
}

// waitStatus waits, up to d, for the instance to reach one of want.
func (e *governedEnv) waitStatus(t *testing.T, id string, d time.Duration, want ...string) governedInstance {
	t.Helper()
	var in governedInstance
	testenv.EventuallyNoError(t, d, fmt.Sprintf("instance %s to be one of %v", id, want), func() error {
		if in = e.status(t, id); !slices.Contains(want, in.Status) {
			return fmt.Errorf("it is %s; its log:\n%s", in.Status, e.logText(t, id))
		}
		return nil
	})
	return in
}

func (e *governedEnv) logText(t *testing.T, id string) string {
	t.Helper()
	var out struct {
		Lines []struct {
			Stream string `json:"stream"`
			Text   string `json:"text"`
		} `json:"lines"`
	}
	call(t, "GET", e.runnerURL+"/api/v1/agents/"+id+"/logs?tail=1000", "", nil, &out)
	var b strings.Builder
	for _, l := range out.Lines {
		fmt.Fprintf(&b, "[%s] %s\n", l.Stream, l.Text)
	}
	return b.String()
}

// waitLog waits, up to d, for a line of the instance's log containing want.
func (e *governedEnv) waitLog(t *testing.T, id, want string, d time.Duration) {
	t.Helper()
	testenv.EventuallyNoError(t, d, fmt.Sprintf("log line %q of %s", want, id), func() error {
		if text := e.logText(t, id); !strings.Contains(text, want) {
			return fmt.Errorf("the log:\n%s", text)
		}
		return nil
	})
}

// decide decides an escalated request through the Librarian's API, as a
// reviewer.
func (e *governedEnv) decide(t *testing.T, requestID, decision, comment string) {
	t.Helper()
	var out map[string]any
	if code := call(t, "POST", e.librarianURL+"/reviews/"+requestID+"/decision", reviewerLibToken,
		map[string]string{"decision": decision, "comment": comment}, &out); code != http.StatusOK {
		t.Fatalf("decision: HTTP %d %v", code, out)
	}
}

// busMessages subscribes to pattern on the bus as the admin and returns
// the payloads delivered, as they come.
func (e *governedEnv) busMessages(t *testing.T, pattern string) <-chan map[string]any {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ws, _, err := websocket.Dial(ctx, e.busURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + adminBusToken}}})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan map[string]any, 256)
	deliver := func(_ context.Context, req *jsonrpc.Request) (any, error) {
		var m struct {
			Payload map[string]any `json:"payload"`
		}
		if err := req.DecodeParams(&m); err == nil {
			select {
			case out <- m.Payload:
			default:
			}
		}
		return map[string]any{"success": true, "processed": false, "stopPropagation": false}, nil
	}
	conn := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), jsonrpc.Methods{"sendMessage": deliver, "processMessage": deliver})
	t.Cleanup(func() { conn.Close() })
	if err := conn.Call(ctx, "initialize", map[string]any{"clientId": "governed-test-" + strings.ReplaceAll(pattern, "*", "x")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := conn.Call(ctx, "subscribe", map[string]string{"topic": pattern, "policy": "continueAll"}, nil); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitEvent waits, up to d, for a payload of type typ for which match
// holds.
func waitEvent(t *testing.T, msgs <-chan map[string]any, typ string, d time.Duration, match func(data map[string]any) bool) map[string]any {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	var seen []string
	for {
		select {
		case m := <-msgs:
			data, _ := m["data"].(map[string]any)
			seen = append(seen, fmt.Sprint(m["type"]))
			if m["type"] == typ && (match == nil || match(data)) {
				return data
			}
		case <-timer.C:
			t.Fatalf("no %s event within %s; saw %v", typ, d, seen)
		}
	}
}

// metrics is what the process's Prometheus endpoint shows.
func (e *governedEnv) metrics(*testing.T) string {
	rec := httptest.NewRecorder()
	e.tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}
