package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/testenv"
)

// busAgentEnv makes this test binary a bus agent (runBusAgent) instead of
// running the tests: the runner starts it with the agent type's env.
// busAgentProbeEnv makes it also try what its token should not allow.
const (
	busAgentEnv      = "CONCLAVE_TEST_BUS_AGENT"
	busAgentProbeEnv = "CONCLAVE_TEST_BUS_AGENT_PROBE"
)

var busAgentVars = []string{"BUB_WORKSPACE", "BUB_DEFAULT_TOPIC", "BUB_AGENT_ID", "BUB_BUS_URL"}

// runBusAgent is an agent as the bub protocol describes one: it logs the four
// BUB_* variables (stderr is the runner's log store) and writes them into
// its workspace, dials BUB_BUS_URL as BUB_AGENT_ID with BUB_TOKEN as its
// bearer token (when set), subscribes to BUB_DEFAULT_TOPIC and answers
// every delivery with its variables. With busAgentProbeEnv it first tries
// to subscribe to and publish on another agent's topic, and subscribes to
// its own, and adds the outcomes (the error code, or "ok") to the
// variables it answers with. It runs until the bus closes the connection.
func runBusAgent() int {
	vars := map[string]string{}
	for _, k := range busAgentVars {
		vars[k] = os.Getenv(k)
		fmt.Fprintf(os.Stderr, "%s=%s\n", k, vars[k])
	}
	env, _ := json.Marshal(vars)
	if err := os.WriteFile(filepath.Join(vars["BUB_WORKSPACE"], vars["BUB_AGENT_ID"]+".json"), env, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bus agent:", err)
		return 1
	}
	ctx := context.Background()
	header := http.Header{}
	if token := os.Getenv("BUB_TOKEN"); token != "" {
		header.Set("Authorization", "Bearer "+token)
		vars["BUB_TOKEN set"] = "yes"
	}
	c, _, err := websocket.Dial(ctx, vars["BUB_BUS_URL"], &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bus agent: dial:", err)
		return 1
	}
	defer c.CloseNow()
	send := func(v any) error {
		b, _ := json.Marshal(v)
		return c.Write(ctx, websocket.MessageText, b)
	}
	// The bus handles a client's requests concurrently: each call waits for
	// its answer. Nothing is delivered before the subscription to
	// BUB_DEFAULT_TOPIC, the last call.
	calls := []map[string]any{
		{"method": "initialize", "params": map[string]any{"clientId": vars["BUB_AGENT_ID"], "clientInfo": map[string]string{"name": "bus-agent", "version": "0.1.0"}}},
	}
	probes := []string{}
	if os.Getenv(busAgentProbeEnv) != "" {
		other := "agent:someone-else"
		calls = append(calls,
			map[string]any{"method": "subscribe", "params": map[string]string{"topic": other}},
			map[string]any{"method": "sendMessage", "params": map[string]any{"topic": other, "payload": map[string]string{"type": "task_request"}}},
			map[string]any{"method": "subscribe", "params": map[string]string{"topic": "agent:" + vars["BUB_AGENT_ID"]}})
		probes = []string{"probe subscribe other", "probe publish other", "probe subscribe own"}
	}
	calls = append(calls, map[string]any{"method": "subscribe", "params": map[string]string{"topic": vars["BUB_DEFAULT_TOPIC"]}})
	for id, call := range calls {
		call["jsonrpc"], call["id"] = "2.0", id+1
		if err := send(call); err != nil {
			return 1
		}
		_, answer, err := c.Read(ctx)
		var out struct {
			Result json.RawMessage
			Error  *struct{ Code int }
		}
		if err != nil || json.Unmarshal(answer, &out) != nil {
			fmt.Fprintf(os.Stderr, "bus agent: %s answered %s (%v)\n", call["method"], answer, err)
			return 1
		}
		if probe := id - 1; probe >= 0 && probe < len(probes) {
			vars[probes[probe]] = "ok"
			if out.Error != nil {
				vars[probes[probe]] = fmt.Sprint(out.Error.Code)
			}
			continue
		}
		if out.Result == nil {
			fmt.Fprintf(os.Stderr, "bus agent: %s answered %s\n", call["method"], answer)
			return 1
		}
	}
	env, _ = json.Marshal(vars)
	for {
		_, frame, err := c.Read(ctx)
		if err != nil {
			return 0 // the bus has gone
		}
		var in struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(frame, &in) != nil || in.Method == "" || in.ID == nil {
			continue // our own calls' answers
		}
		if err := send(map[string]any{"jsonrpc": "2.0", "id": in.ID,
			"result": map[string]any{"processed": true, "should_retry": false, "retry_seconds": 0, "message": string(env)}}); err != nil {
			return 0
		}
	}
}

// devWithBusAgent runs conclave dev with the bus launching agents of type
// bus-agent through its runner: this test binary, with each of agentEnv
// set to "1", in a workspace of its own; args are further flags. It
// returns its endpoints (as testenv.Dev.Addrs names them), the workspace
// and its logs.
func devWithBusAgent(t *testing.T, agentEnv []string, args ...string) (addrs map[string]string, ws string, stderr *testenv.LockedBuffer) {
	t.Helper()
	dir := t.TempDir()
	ws = filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := make([]string, len(agentEnv))
	for i, k := range agentEnv {
		env[i] = k + `: "1"`
	}
	types := filepath.Join(dir, "types.yaml")
	if err := os.WriteFile(types, []byte(fmt.Sprintf("agent_types:\n  - id: bus-agent\n    command: [%q]\n    env: {%s}\n    launch_env: [BUB_*]\n    protocol: legacy\n    enabled: true\n",
		self, strings.Join(env, ", "))), 0o644); err != nil {
		t.Fatal(err)
	}
	_, addrs, stderr = devProcess(t, filepath.Join(dir, "data"), append([]string{"--runner-agent-types=" + types, "--runner-workspace-roots=" + dir,
		"--bus-workspace=" + ws, "--bus-runner-agent-type=bus-agent"}, args...)...)
	return addrs, ws, stderr
}

// TestDevDefaultHandlerLaunchesThroughRunner runs conclave dev with a bus
// agent type: a message on a topic nobody subscribes to makes the bus ask
// conclave dev's own runner for an agent, which gets the four BUB_*
// variables, subscribes, and takes the message; the next message on the
// topic goes to the same agent, with no second launch.
func TestDevDefaultHandlerLaunchesThroughRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary and an agent")
	}
	t.Parallel()
	addrs, ws, stderr := devWithBusAgent(t, []string{busAgentEnv})
	busURL := "ws://" + addrs["bus WebSocket"]

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, busURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	call := busCaller(t, ctx, c, stderr)
	call(1, "initialize", `{"clientId":"bridge","clientInfo":{"name":"telegram-bridge","version":"0.1.0"}}`)
	var agentID string
	for i, text := range []string{"hello", "again"} {
		res := call(2+i, "sendMessage", fmt.Sprintf(`{"topic":"tg:777","payload":{"type":"telegram_message","text":%q}}`, text))
		acks, _ := res["acks"].([]any)
		if len(acks) != 1 {
			t.Fatalf("sendMessage %q: %v\n%s", text, res, stderr)
		}
		ack := testenv.At[map[string]any](t, acks, 0)
		var got map[string]string
		if ack["processed"] != true || json.Unmarshal([]byte(fmt.Sprint(ack["message"])), &got) != nil {
			t.Fatalf("ack %v; the runner has: %s", ack, runnerTask(addrs["runner HTTP"], fmt.Sprint(ack["client_id"])))
		}
		if i == 0 {
			agentID = fmt.Sprint(ack["client_id"])
		}
		want := map[string]string{"BUB_WORKSPACE": ws, "BUB_DEFAULT_TOPIC": "tg:777", "BUB_AGENT_ID": agentID, "BUB_BUS_URL": busURL}
		for _, k := range busAgentVars {
			if got[k] != want[k] {
				t.Errorf("message %q: the agent got %s=%q, want %q", text, k, got[k], want[k])
			}
		}
		if ack["client_id"] != agentID {
			t.Errorf("message %q went to %v, not the agent launched first (%s)", text, ack["client_id"], agentID)
		}
	}
	// The agent ran in the runner's process with the variables: it wrote
	// them into BUB_WORKSPACE before dialling the bus.
	written, err := os.ReadFile(filepath.Join(ws, agentID+".json"))
	var inWorkspace map[string]string
	if err != nil || json.Unmarshal(written, &inWorkspace) != nil || inWorkspace["BUB_AGENT_ID"] != agentID ||
		inWorkspace["BUB_DEFAULT_TOPIC"] != "tg:777" || inWorkspace["BUB_BUS_URL"] != busURL || inWorkspace["BUB_WORKSPACE"] != ws {
		t.Errorf("the agent's variables in BUB_WORKSPACE: %s (%v)", written, err)
	}

	// The runner holds the launch: its task is the agent's id, with one
	// instance.
	runner := "http://" + addrs["runner HTTP"]
	var task struct {
		InstanceIDs []string `json:"instance_ids"`
	}
	getRunnerJSON(t, runner+"/api/v1/tasks/"+agentID, &task)
	if len(task.InstanceIDs) != 1 {
		t.Fatalf("task %s has instances %v, want one launch", agentID, task.InstanceIDs)
	}
}

// runnerTask is what the runner says of the task and its launches, to
// explain a launch that failed.
func runnerTask(addr, taskID string) string {
	var out strings.Builder
	get := func(path string) []byte {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	task := get("/api/v1/tasks/" + taskID)
	fmt.Fprintf(&out, "task %s", task)
	var tk struct {
		InstanceIDs []string `json:"instance_ids"`
	}
	_ = json.Unmarshal(task, &tk)
	for _, id := range tk.InstanceIDs {
		fmt.Fprintf(&out, "\ninstance %s: %s\nlogs: %s", id, get("/api/v1/agents/"+id+"/status"), get("/api/v1/agents/"+id+"/logs?tail=1000"))
	}
	return out.String()
}

func getRunnerJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestDevLaunchedAgentIsConfinedByItsToken runs conclave dev with bus
// tokens required: the agent the runner launches for the bus authenticates
// with the BUB_TOKEN the bus minted for it, takes its message, and may
// subscribe to agent:{its id} but not subscribe to or publish on another
// agent's topic.
func TestDevLaunchedAgentIsConfinedByItsToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the conclave binary and an agent")
	}
	t.Parallel()
	const bridgeToken = "bridge-token-0123456789"
	addrs, _, stderr := devWithBusAgent(t, []string{busAgentEnv, busAgentProbeEnv}, "--bus-allow-unauthenticated=false",
		`--bus-grants=[{"token":"`+bridgeToken+`","client_id":"bridge","publish":["tg:*"],"subscribe":[]}]`)
	busURL := "ws://" + addrs["bus WebSocket"]

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Without a token the bus refuses.
	anon, _, err := websocket.Dial(ctx, busURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer anon.CloseNow()
	if err := anon.Write(ctx, websocket.MessageText, []byte(`{"jsonrpc":"2.0","method":"initialize","params":{"clientId":"anon"},"id":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, answer, err := anon.Read(ctx); err != nil || !strings.Contains(string(answer), "-32005") {
		t.Fatalf("initialize without a token: %s (%v)", answer, err)
	}

	c, _, err := websocket.Dial(ctx, busURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + bridgeToken}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	call := busCaller(t, ctx, c, stderr)
	call(1, "initialize", `{"clientId":"bridge"}`)
	res := call(2, "sendMessage", `{"topic":"tg:888","payload":{"type":"telegram_message","text":"hello"}}`)
	acks, _ := res["acks"].([]any)
	if len(acks) != 1 {
		t.Fatalf("sendMessage: %v\n%s", res, stderr)
	}
	ack := testenv.At[map[string]any](t, acks, 0)
	var got map[string]string
	if ack["processed"] != true || json.Unmarshal([]byte(fmt.Sprint(ack["message"])), &got) != nil {
		t.Fatalf("ack %v; the runner has: %s", ack, runnerTask(addrs["runner HTTP"], fmt.Sprint(ack["client_id"])))
	}
	want := map[string]string{"BUB_TOKEN set": "yes", "BUB_DEFAULT_TOPIC": "tg:888", "BUB_AGENT_ID": fmt.Sprint(ack["client_id"]),
		"probe subscribe other": "-32005", "probe publish other": "-32005", "probe subscribe own": "ok"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("the launched agent reports %s=%q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}

// busCaller returns a call of a bub method on c: it sends a request with
// id and params (JSON) and returns the answer's result, failing the test,
// with the dev process's stderr, on anything else.
func busCaller(t *testing.T, ctx context.Context, c *websocket.Conn, stderr fmt.Stringer) func(id int, method, params string) map[string]any {
	return func(id int, method, params string) map[string]any {
		t.Helper()
		frame := fmt.Sprintf(`{"jsonrpc":"2.0","method":%q,"params":%s,"id":%d}`, method, params, id)
		if err := c.Write(ctx, websocket.MessageText, []byte(frame)); err != nil {
			t.Fatal(err)
		}
		_, answer, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("%s: %v\n%s", method, err, stderr)
		}
		var res struct{ Result map[string]any }
		if err := json.Unmarshal(answer, &res); err != nil || res.Result == nil {
			t.Fatalf("%s answered %s", method, answer)
		}
		return res.Result
	}
}
