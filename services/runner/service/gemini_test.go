package service_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/testenv"
	"github.com/conclave-ai/conclave/services/runner/runnertest"
)

// geminiReply is the fake model of TestGeminiCLI: asked to write
// notes.txt, it calls Gemini CLI's write_file tool; given the tool's
// result, it says how it went; asked anything else, it answers from what
// the conversation holds.
func geminiReply(req testenv.GeminiRequest) testenv.GeminiPart {
	last := req.LastUser()
	for _, p := range last.Parts {
		if r := p.FunctionResponse; r != nil && r.Name == "write_file" {
			if e, ok := r.Response["error"]; ok {
				return testenv.GeminiPart{Text: fmt.Sprintf("The write was refused: %v", e)}
			}
			return testenv.GeminiPart{Text: "I wrote notes.txt."}
		}
	}
	if strings.Contains(last.Text(), "write notes.txt") {
		return testenv.GeminiPart{FunctionCall: &testenv.GeminiFunctionCall{Name: "write_file",
			Args: map[string]any{"file_path": "notes.txt", "content": "notes from gemini\n"}}}
	}
	if req.Method == "streamGenerateContent" && len(req.Contents) > 2 {
		return testenv.GeminiPart{Text: fmt.Sprintf("Earlier I wrote notes.txt (%d contents of history).", len(req.Contents))}
	}
	// Gemini CLI's side requests (a JSON verdict, a summary): valid JSON.
	return testenv.GeminiPart{Text: "{}"}
}

// geminiTypes writes the agent types of Gemini CLI (@google/gemini-cli,
// pinned in package-lock.json) for the fake API at apiURL: with the
// allow and the deny policies, authenticating with its API key, and one
// given no key at all. Each has a home of its own (GEMINI_CLI_HOME), whose
// settings turn its usage statistics off; nothing else it does reaches
// for the network, and a test machine has none.
func geminiTypes(t *testing.T, apiURL string) (path string, homes map[string]string) {
	t.Helper()
	node, gemini, err := testenv.NodeScript("@google", "gemini-cli", "bundle", "gemini.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gemini); err != nil {
		t.Fatalf("Gemini CLI is not installed (run npm ci at the repository's root): %v", err)
	}
	var b strings.Builder
	b.WriteString("agent_types:\n")
	homes = map[string]string{}
	for _, tt := range []struct {
		id, permission, authMethod string
		key                        bool
	}{
		{"gemini", "allow", "gemini-api-key", true},
		{"gemini-deny", "deny", "gemini-api-key", true},
		{"gemini-no-key", "allow", "", false},
	} {
		home := t.TempDir()
		if err := os.MkdirAll(filepath.Join(home, ".gemini"), 0o755); err != nil {
			t.Fatal(err)
		}
		settings := `{"general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false}, "privacy": {"usageStatisticsEnabled": false}}`
		if err := os.WriteFile(filepath.Join(home, ".gemini", "settings.json"), []byte(settings), 0o644); err != nil {
			t.Fatal(err)
		}
		homes[tt.id] = home
		env := map[string]string{"GEMINI_CLI_HOME": home, "GEMINI_MODEL": "gemini-2.5-flash", "GEMINI_CLI_NO_RELAUNCH": "true"}
		if tt.key {
			env["GEMINI_API_KEY"], env["GOOGLE_GEMINI_BASE_URL"] = "test-key", apiURL
		}
		envJSON, _ := json.Marshal(env)
		fmt.Fprintf(&b, "  - id: %s\n    command: [%q, %q, --acp]\n    protocol: acp\n    permission: %s\n    auth_method: %q\n    timeout: 5m\n    env: %s\n",
			tt.id, node, gemini, tt.permission, tt.authMethod, envJSON)
	}
	path = filepath.Join(t.TempDir(), "gemini-types.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, homes
}

// TestGeminiCLI runs Gemini CLI, an ACP agent people use, through the
// runner against a fake Gemini API on loopback (testenv.GeminiAPI): a
// whole prompt turn with a tool call (write_file, asked through
// session/request_permission, written through fs/write_text_file into the
// workspace), the same refused under the deny policy, a launch without an
// API key failing with the agent's own error, and a resumed session, which
// Gemini CLI replays after it answers session/load.
func TestGeminiCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Gemini CLI")
	}
	t.Parallel()
	api, err := testenv.StartGeminiAPI(geminiReply)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Close() })
	types, homes := geminiTypes(t, api.URL)
	overrides := map[string]string{
		"CONCLAVE_RUNNER_AGENT_TYPES": types,
		// Node loads Gemini CLI's 96 MB bundle: seconds on a busy machine.
		"CONCLAVE_RUNNER_PROTOCOL_TIMEOUT": "60s",
		// The agent goes idle soon after its turn, for the resumption.
		"CONCLAVE_RUNNER_IDLE_TIMEOUT": "2s",
	}
	workspace := func(t *testing.T, r *testRunner) string {
		ws := r.workspace(t)
		if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("old notes\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return ws
	}

	t.Run("a turn with a tool call then a resumed one", func(t *testing.T) {
		t.Parallel()
		r := startRunner(t, overrides)
		ws := workspace(t, r)
		in := r.Launch(t, "gemini", ws, map[string]string{"TASK_DESCRIPTION": "write notes.txt"})
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
			t.Fatalf("status %+v; logs %+v", st, r.Logs(t, in.ID))
		}
		// The model's answer streams in two chunks, "I" and " wrote
		// notes.txt.": a replay of it, later, would be one.
		for _, want := range []string{
			"authenticated with the agent's auth method gemini-api-key",
			"permission_request Writing to notes.txt: options proceed_always [allow_always], proceed_once [allow_once], cancel [reject_once]",
			"permission_outcome Writing to notes.txt [selected]: selected proceed_once [allow_once] (policy allow)",
			"tool_call_update Writing to notes.txt [completed]",
			"content:  wrote notes.txt.",
		} {
			r.WaitLogWithin(t, in.ID, want, 2*time.Minute)
		}
		if data, err := os.ReadFile(filepath.Join(ws, "notes.txt")); err != nil || string(data) != "notes from gemini\n" {
			t.Errorf("notes.txt holds %q (%v), want what the model wrote", data, err)
		}
		var wrote bool
		for _, req := range api.Requests() {
			for _, p := range req.LastUser().Parts {
				if fr := p.FunctionResponse; fr != nil && req.APIKey == "test-key" && strings.Contains(fmt.Sprint(fr.Response["output"]), "Successfully overwrote file") {
					wrote = true
				}
			}
		}
		if !wrote {
			t.Errorf("the model was not sent write_file's result; requests %+v", api.Requests())
		}
		events := waitUpdateEvents(t, r, in.ID, "content", " wrote notes.txt.")
		for _, kind := range []string{"available_commands_update", "permission_request", "permission_outcome", "tool_call_update"} {
			if !hasEvent(events, kind) {
				t.Errorf("no %s event on the task's topic; got %+v", kind, events)
			}
		}

		// Resumed: the agent has gone idle; the next prompt loads the
		// session in a new process. Gemini CLI answers session/load, then
		// replays the history (the earlier prompt, tool call and answer):
		// none of it is the new turn's.
		r.WaitLogWithin(t, in.ID, "launch 1 ended", 2*time.Minute)
		var sess struct {
			SessionID string `json:"session_id"`
		}
		r.Do(t, "GET", "/api/v1/agents/"+in.ID+"/session", nil, &sess)
		backdateGeminiSession(t, homes["gemini"], sess.SessionID)
		r.prompt(t, in.ID, "what did you do?")
		r.WaitLogWithin(t, in.ID, "launch 2 ended", 2*time.Minute)
		if st := r.Status(t, in.ID); st.Status != "completed" {
			t.Fatalf("the resumed turn: %+v; logs %+v", st, r.Logs(t, in.ID))
		}
		lines := r.Logs(t, in.ID)
		if !runnertest.HasLog(lines, "content:  I wrote notes.txt (") {
			t.Errorf("the resumed turn's answer is not in the log: %+v", lines)
		}
		if runnertest.HasLog(lines, "content: I wrote notes.txt.") {
			t.Errorf("the first turn's answer was replayed into the log as the resumed turn's: %+v", lines)
		}
		if runnertest.HasLog(lines, "user_message_chunk") {
			t.Errorf("the replayed history was logged: %+v", lines)
		}
		for _, e := range waitUpdateEvents(t, r, in.ID, "content", " I wrote notes.txt (") {
			if e.Kind == "user_message_chunk" || e.Text == "I wrote notes.txt." {
				t.Errorf("a replayed update was published: %+v", e)
			}
		}
	})

	t.Run("the deny policy", func(t *testing.T) {
		t.Parallel()
		r := startRunner(t, overrides)
		ws := workspace(t, r)
		in := r.Launch(t, "gemini-deny", ws, map[string]string{"TASK_DESCRIPTION": "write notes.txt"})
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "completed" {
			t.Fatalf("status %+v; logs %+v", st, r.Logs(t, in.ID))
		}
		r.WaitLogWithin(t, in.ID, "permission_outcome Writing to notes.txt [selected]: selected cancel [reject_once] (policy deny)", 2*time.Minute)
		r.WaitLogWithin(t, in.ID, "content:  write was refused: Tool \"write_file\" was canceled by the user", 2*time.Minute)
		if data, err := os.ReadFile(filepath.Join(ws, "notes.txt")); err != nil || string(data) != "old notes\n" {
			t.Errorf("notes.txt holds %q (%v), want it untouched", data, err)
		}
	})

	t.Run("no API key", func(t *testing.T) {
		t.Parallel()
		r := startRunner(t, overrides)
		in := r.Launch(t, "gemini-no-key", workspace(t, r), map[string]string{"TASK_DESCRIPTION": "write notes.txt"})
		if st := r.WaitStatus(t, in.ID, "completed", "failed", "stopped"); st.Status != "failed" {
			t.Fatalf("status %+v; logs %+v", st, r.Logs(t, in.ID))
		}
		r.WaitLogWithin(t, in.ID, "launch 1 ended (agent_error: session/new: the agent answered with an error: Gemini API key is missing or not configured.", 2*time.Minute)
		r.WaitLogWithin(t, in.ID, "the agent offers authMethods oauth-personal (Log in with Google), gemini-api-key (Gemini API key)", 2*time.Minute)
	})
}

func hasEvent(events []updateEvent, kind string) bool {
	for _, e := range events {
		if e.Kind == kind {
			return true
		}
	}
	return false
}

// backdateGeminiSession renames Gemini CLI's record of a session so that
// its name carries another minute than now. Gemini CLI (0.61) names a
// session's record by the minute it starts and the session id's first 8
// characters, and a session/load starts a record under that name before
// it reads the old one: within the minute the session began, the load
// finds its own empty record instead, and fails "Invalid session
// identifier". A resumption comes minutes later in real use; the test's
// comes seconds later.
func backdateGeminiSession(t *testing.T, home, sessionID string) {
	t.Helper()
	if len(sessionID) < 8 {
		t.Fatalf("session id %q", sessionID)
	}
	records, err := filepath.Glob(filepath.Join(home, ".gemini", "tmp", "*", "chats", "session-*-"+sessionID[:8]+".json*"))
	if err != nil || len(records) == 0 {
		t.Fatalf("no record of Gemini CLI's session %s under %s (%v)", sessionID, home, err)
	}
	for _, rec := range records {
		backdated := filepath.Join(filepath.Dir(rec), "session-2000-01-01T00-00-"+sessionID[:8]+filepath.Ext(rec))
		if err := os.Rename(rec, backdated); err != nil {
			t.Fatal(err)
		}
	}
}
