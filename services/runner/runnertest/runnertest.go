// Package runnertest holds what the runner's service tests and its
// Kubernetes tests (services/runner/kubetest) share: a runner started for
// a test, and its REST API as a test calls it, with waits that have a
// deadline and name what they wait for.
package runnertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/queue"
	"github.com/conclave-ai/conclave/pkg/store"
	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/service"
)

// DefaultWaitTimeout bounds an API's waits when its WaitTimeout is zero:
// far longer than any of them takes, it only keeps a hang from running
// into the whole run's timeout.
const DefaultWaitTimeout = 2 * time.Minute

// Config loads the runner's configuration from vars, as its environment.
func Config(t testing.TB, vars map[string]string) service.Config {
	t.Helper()
	var cfg struct{ Runner service.Config }
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	if err := config.Load(context.Background(), &cfg, "runner", nil, lookup, io.Discard); err != nil {
		t.Fatal(err)
	}
	return cfg.Runner
}

// State is an embedded store and queue in a directory of the test's,
// prepared for a runner with cfg; runners started on them are replicas of
// one another.
func State(t testing.TB, cfg service.Config) (store.Store, queue.Queue) {
	t.Helper()
	return testenv.EmbeddedStore(t, service.Tables...), testenv.EmbeddedQueue(t, service.Queues(cfg)...)
}

// Prepare creates the runner's tables on st and its queues on q, as its
// deployment does before it starts.
func Prepare(t testing.TB, cfg service.Config, st store.Store, q queue.Queue) {
	t.Helper()
	ctx := context.Background()
	if err := store.EnsureTables(ctx, st, service.Tables...); err != nil {
		t.Fatal(err)
	}
	for _, d := range service.Queues(cfg) {
		if err := q.Ensure(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
}

// Start runs service.New(cfg, deps) until the test ends or stop is
// called, and returns once it is ready; stop returns Run's error.
func Start(t testing.TB, cfg service.Config, deps service.Deps) (r *service.Runner, api *API, stop func() error) {
	t.Helper()
	r, err := service.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	var (
		once   sync.Once
		runErr error
	)
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("runner.Run: %v", err)
		}
	})
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("runner stopped: %v", err)
	}
	api = &API{}
	for _, e := range r.Endpoints() {
		if strings.HasPrefix(e.Protocol, "HTTP") {
			api.Base = "http://" + e.Address
		}
	}
	return r, api, stop
}

// Logger is a runner's logger in a test: silent, or into the test's log
// under -v at level. A fuzz test's is silent: its runner outlives each
// input, and testing panics when F.Log is called while an input runs.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	if _, fuzz := t.(*testing.F); fuzz || !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(TWriter{t}, &slog.HandlerOptions{Level: level}))
}

// TWriter writes into the test's log, a line at a time.
type TWriter struct{ T testing.TB }

func (w TWriter) Write(p []byte) (int, error) {
	w.T.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// API is a runner's REST API as a test calls it.
type API struct {
	// Base is the API's URL, e.g. http://127.0.0.1:8082.
	Base string
	// Token, when set, is sent as a bearer token.
	Token string
	// WaitTimeout bounds WaitStatus, WaitLog and Prompt; zero is
	// DefaultWaitTimeout.
	WaitTimeout time.Duration
}

// Instance is an agent instance as the API answers it.
type Instance struct {
	ID          string `json:"id"`
	TaskID      string `json:"task_id"`
	AgentType   string `json:"agent_type"`
	ContainerID string `json:"container_id"`
	Status      string `json:"status"`
	Progress    int    `json:"progress"`
	StartedAt   string `json:"started_at"`
	FinishedAt  string `json:"finished_at"`
	Error       string `json:"error"`
}

// LogLine is a line of an instance's log.
type LogLine struct {
	Time   time.Time `json:"time"`
	Stream string    `json:"stream"`
	Text   string    `json:"text"`
}

func (a *API) waitTimeout() time.Duration {
	if a.WaitTimeout > 0 {
		return a.WaitTimeout
	}
	return DefaultWaitTimeout
}

// Do sends a request and decodes the JSON answer into out (nil: not
// decoded); it returns the HTTP status. It is not bound to the test's
// context, so that a cleanup may call it.
func (a *API) Do(t testing.TB, method, path string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.waitTimeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.Base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

// Launch launches agentType in workspace for a task named after the test.
func (a *API) Launch(t *testing.T, agentType, workspace string, env map[string]string) Instance {
	t.Helper()
	var in Instance
	if code := a.Do(t, "POST", "/api/v1/agents/launch", map[string]any{
		"task_id": "task-" + strings.ReplaceAll(t.Name(), "/", "-"), "agent_type": agentType, "workspace_path": workspace, "env": env, "priority": 1, "metadata": map[string]any{"origin": "test"},
	}, &in); code != http.StatusOK {
		t.Fatalf("launch %s: HTTP %d %+v", agentType, code, in)
	}
	return in
}

// Status is the instance's status.
func (a *API) Status(t testing.TB, id string) Instance {
	t.Helper()
	var in Instance
	if code := a.Do(t, "GET", "/api/v1/agents/"+id+"/status", nil, &in); code != http.StatusOK {
		t.Fatalf("status: HTTP %d", code)
	}
	return in
}

// WaitStatus polls until the instance reaches one of want.
func (a *API) WaitStatus(t testing.TB, id string, want ...string) Instance {
	t.Helper()
	var in Instance
	testenv.EventuallyNoError(t, a.waitTimeout(), fmt.Sprintf("%s to be %v", id, want), func() error {
		in = a.Status(t, id)
		if !slices.Contains(want, in.Status) {
			return fmt.Errorf("status %s", in.Status)
		}
		return nil
	})
	return in
}

// Logs is the last thousand lines of the instance's log.
func (a *API) Logs(t testing.TB, id string) []LogLine {
	t.Helper()
	var out struct {
		Lines []LogLine `json:"lines"`
	}
	if code := a.Do(t, "GET", "/api/v1/agents/"+id+"/logs?tail=1000", nil, &out); code != http.StatusOK {
		t.Fatalf("logs: HTTP %d", code)
	}
	return out.Lines
}

// WaitLog polls the logs until a line contains want, and returns them.
func (a *API) WaitLog(t testing.TB, id, want string) []LogLine {
	t.Helper()
	return a.WaitLogWithin(t, id, want, a.waitTimeout())
}

// WaitLogWithin is WaitLog bounded by d: past it the test fails, with the
// log so far.
func (a *API) WaitLogWithin(t testing.TB, id, want string, d time.Duration) []LogLine {
	t.Helper()
	var lines []LogLine
	testenv.EventuallyNoError(t, d, fmt.Sprintf("log line %q of %s", want, id), func() error {
		if lines = a.Logs(t, id); !HasLog(lines, want) {
			return fmt.Errorf("the log: %+v", lines)
		}
		return nil
	})
	return lines
}

// HasLog reports whether a line contains want.
func HasLog(lines []LogLine, want string) bool {
	return slices.ContainsFunc(lines, func(l LogLine) bool { return strings.Contains(l.Text, want) })
}

// Follow streams GET .../logs?follow=true from the last tail lines, as an
// API client watches an agent; the channel closes when the stream ends,
// and the stream ends with the test, read to its end or not.
func (a *API) Follow(t testing.TB, id string, tail int) <-chan LogLine {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/api/v1/agents/%s/logs?follow=true&tail=%d", a.Base, id, tail), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.Token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("follow: HTTP %d", resp.StatusCode)
	}
	out := make(chan LogLine, 4096)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l LogLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Text != "" {
				select {
				case out <- l:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// AwaitLine reads followed lines until one contains want, failing t when
// the log ends first or none comes within d.
func AwaitLine(t testing.TB, lines <-chan LogLine, want string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the followed log ended without a line containing %q", want)
			}
			if strings.Contains(l.Text, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no followed log line containing %q within %s", want, d)
		}
	}
}
