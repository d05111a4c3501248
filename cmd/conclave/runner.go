package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/httpclient"
)

const runnerUsage = `Usage: conclave runner <command> [flags]

Commands (REST; --url or CONCLAVE_RUNNER_URL, --token or CONCLAVE_RUNNER_TOKEN):
  launch --type TYPE --workspace DIR [--task ID] [--env K=V]... [--prompt TEXT]
                            launch an agent; prints the instance
  prompt INSTANCE_ID TEXT   send a prompt
  list [--status S] [--type TYPE] [--page-size N] [--page-token T]
                            list instances, newest first: a page, and the
                            next_page_token to pass for the next
  status INSTANCE_ID        print an instance's status
  logs INSTANCE_ID [--tail N] [--follow]
                            print an instance's logs; --follow streams new lines
  cancel INSTANCE_ID [--reason TEXT]
                            cancel the instance's turn
  delete INSTANCE_ID        stop the instance and remove it
  types                     list the agent types
`

// repeated is a flag that may be given many times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func runRunner(ctx context.Context, args []string, lookup config.Lookup, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, runnerUsage)
		return errors.New("runner: no command given")
	}
	cmd, rest := args[0], args[1:]
	if cmd == "help" || cmd == "-h" || cmd == "--help" {
		fmt.Fprint(stdout, runnerUsage)
		return nil
	}
	fs := flag.NewFlagSet("conclave runner "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	baseURL := fs.String("url", envOr(lookup, "CONCLAVE_RUNNER_URL", "http://127.0.0.1:8082"), "the runner's URL")
	token := fs.String("token", envOr(lookup, "CONCLAVE_RUNNER_TOKEN", ""), "bearer token")
	agentType := fs.String("type", "", "agent type (launch; list: only instances of it)")
	workspace := fs.String("workspace", "", "absolute workspace path (launch)")
	task := fs.String("task", "", "task id (launch; default: a new one)")
	prompt := fs.String("prompt", "", "the task's prompt, sent as TASK_DESCRIPTION (launch)")
	var env repeated
	fs.Var(&env, "env", "K=V for the agent's environment (launch; repeatable)")
	tail := fs.Int("tail", 100, "lines of log to print first (logs)")
	follow := fs.Bool("follow", false, "stream new log lines until the instance's launch ends (logs)")
	reason := fs.String("reason", "cancelled from the command line", "why (cancel)")
	status := fs.String("status", "", "only instances in this status (list)")
	pageSize := fs.Int("page-size", 0, "instances per page, 0 for the runner's default (list)")
	pageToken := fs.String("page-token", "", "a previous list's next_page_token (list)")
	positional, err := parseInterleaved(fs, rest)
	if err != nil {
		return err
	}
	c := &runnerClient{httpclient.New(*baseURL, *token)}
	need := argCount("runner "+cmd, positional)
	switch cmd {
	case "launch":
		if err := need(0, "no arguments, only flags"); err != nil {
			return err
		}
		if *agentType == "" || *workspace == "" {
			return errors.New("runner launch: --type and --workspace are required")
		}
		vars := map[string]string{}
		for _, kv := range env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("runner launch: --env %q is not K=V", kv)
			}
			vars[k] = v
		}
		if *prompt != "" {
			vars["TASK_DESCRIPTION"] = *prompt
		}
		if *task == "" {
			*task = fmt.Sprintf("cli-%d", time.Now().UnixNano())
		}
		return c.print(ctx, stdout, http.MethodPost, "/api/v1/agents/launch", map[string]any{
			"task_id": *task, "agent_type": *agentType, "workspace_path": *workspace, "env": vars})
	case "prompt":
		if err := need(2, "an instance id and the prompt"); err != nil {
			return err
		}
		return c.print(ctx, stdout, http.MethodPost, "/api/v1/agents/"+url.PathEscape(positional[0])+"/prompt", map[string]string{"message": positional[1]})
	case "status", "cancel", "delete":
		if err := need(1, "an instance id"); err != nil {
			return err
		}
		id := url.PathEscape(positional[0])
		switch cmd {
		case "status":
			return c.print(ctx, stdout, http.MethodGet, "/api/v1/agents/"+id+"/status", nil)
		case "cancel":
			return c.print(ctx, stdout, http.MethodPost, "/api/v1/agents/"+id+"/cancel", map[string]string{"reason": *reason})
		}
		return c.print(ctx, stdout, http.MethodDelete, "/api/v1/agents/"+id, nil)
	case "logs":
		if err := need(1, "an instance id"); err != nil {
			return err
		}
		return c.logs(ctx, stdout, positional[0], *tail, *follow)
	case "list":
		if err := need(0, "no arguments, only flags"); err != nil {
			return err
		}
		q := url.Values{}
		for k, v := range map[string]string{"status": *status, "agent_type": *agentType, "page_token": *pageToken} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if *pageSize != 0 {
			q.Set("page_size", fmt.Sprint(*pageSize))
		}
		path := "/api/v1/agents"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		return c.print(ctx, stdout, http.MethodGet, path, nil)
	case "types":
		return c.print(ctx, stdout, http.MethodGet, "/api/v1/agent-types", nil)
	}
	fmt.Fprint(stderr, runnerUsage)
	return fmt.Errorf("runner: unknown command %q", cmd)
}

// runnerClient is the runner's REST API.
type runnerClient struct{ *httpclient.Client }

// print sends a request and prints its JSON answer, indented.
func (c *runnerClient) print(ctx context.Context, w io.Writer, method, path string, body any) error {
	answer, err := c.Do(ctx, method, path, body)
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	return printJSON(w, answer)
}

type cliLogLine struct {
	Time   string `json:"time"`
	Stream string `json:"stream"`
	Text   string `json:"text"`
}

func (l cliLogLine) String() string { return fmt.Sprintf("%s %-6s %s", l.Time, l.Stream, l.Text) }

// logs prints the tail, and with follow streams newline-delimited JSON
// lines until the launch ends.
func (c *runnerClient) logs(ctx context.Context, w io.Writer, id string, tail int, follow bool) error {
	path := fmt.Sprintf("/api/v1/agents/%s/logs?tail=%d", url.PathEscape(id), tail)
	if !follow {
		var out struct{ Lines []cliLogLine }
		if err := c.JSON(ctx, http.MethodGet, path, nil, &out); err != nil {
			return fmt.Errorf("runner: %w", err)
		}
		for _, l := range out.Lines {
			fmt.Fprintln(w, l)
		}
		return nil
	}
	body, err := c.Stream(ctx, http.MethodGet, path+"&follow=true", nil)
	if err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			cliLogLine
			Error *struct{ Error, Message string } `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("logs: %w", err)
		}
		if l.Error != nil {
			return fmt.Errorf("logs: %s: %s", l.Error.Error, l.Error.Message)
		}
		fmt.Fprintln(w, l.cliLogLine)
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
