package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	librarian "github.com/conclave-ai/conclave/functions/librarian/service"
	"github.com/conclave-ai/conclave/pkg/config"
	"github.com/conclave-ai/conclave/pkg/httpclient"
	"github.com/conclave-ai/conclave/pkg/storage"
	"github.com/conclave-ai/conclave/pkg/store"
)

const librarianUsage = `Usage: conclave librarian <command> [flags]

Client commands (HTTP; --url or CONCLAVE_LIBRARIAN_URL, --token or CONCLAVE_LIBRARIAN_TOKEN):
  request FILE|-            submit an AgentRequest (JSON) and print the decision
  status REQUEST_ID         print a request's status
  query [--agent ID] TEXT   rank the knowledge graph's nodes for TEXT, asking as agent ID
                            (needed without a token, as in conclave dev: e.g. --agent gemini-pro)
  review list               list the requests waiting for a human
  review approve|reject ID -m COMMENT
                            decide an escalated request (reviewer token)

Operator commands (on the store: CONCLAVE_BACKEND, CONCLAVE_DATA_DIR, CONCLAVE_TABLE_PREFIX):
  tokens create --agent ID | --reviewer NAME
                            issue a bearer token (printed once; only its hash is kept)
  tokens revoke TOKEN_ID    revoke a token
  import DIR                load a seed knowledge graph from Markdown files
`

func runLibrarian(ctx context.Context, args []string, lookup config.Lookup, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, librarianUsage)
		return errors.New("librarian: no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(stdout, librarianUsage)
		return nil
	case "tokens", "import":
		return librarianAdmin(ctx, cmd, rest, lookup, stdout, stderr)
	}
	var usage string
	switch cmd {
	case "request":
		usage = "request FILE|-"
	case "status":
		usage = "status REQUEST_ID"
	case "query":
		usage = "query [--agent ID] TEXT"
	case "review":
		usage = "review list | review approve|reject REQUEST_ID -m COMMENT"
	default:
		fmt.Fprint(stderr, librarianUsage)
		return fmt.Errorf("librarian: unknown command %q", cmd)
	}
	fs := flag.NewFlagSet("conclave librarian "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: conclave librarian %s [flags]\n\nFlags:\n", usage)
		fs.PrintDefaults()
	}
	baseURL := fs.String("url", envOr(lookup, "CONCLAVE_LIBRARIAN_URL", "http://127.0.0.1:8081"), "the Librarian's URL (CONCLAVE_LIBRARIAN_URL)")
	token := fs.String("token", envOr(lookup, "CONCLAVE_LIBRARIAN_TOKEN", ""), "bearer token, an agent's, or a reviewer's for review (CONCLAVE_LIBRARIAN_TOKEN)")
	var comment, agent *string
	switch cmd {
	case "review":
		comment = fs.String("m", "", "the reviewer's comment on approve or reject")
	case "query":
		agent = fs.String("agent", envOr(lookup, "CONCLAVE_LIBRARIAN_AGENT_ID", ""),
			"the agent to ask as, one of config/agents.yaml (CONCLAVE_LIBRARIAN_AGENT_ID); needed without a token, as in conclave dev; a token names its own")
	}
	positional, err := parseInterleaved(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	c := httpclient.New(*baseURL, *token)
	call := func(method, path string, body any) error {
		answer, err := c.Do(ctx, method, path, body)
		if err != nil {
			return fmt.Errorf("librarian: %w", err)
		}
		return printJSON(stdout, answer)
	}
	need := argCount("librarian "+cmd, positional)
	switch cmd {
	case "request":
		if err := need(1, "a file name, or - for standard input"); err != nil {
			return err
		}
		var body []byte
		var err error
		if positional[0] == "-" {
			body, err = io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
		} else {
			body, err = os.ReadFile(positional[0])
		}
		if err != nil {
			return err
		}
		return call(http.MethodPost, "/agent/request", json.RawMessage(body))
	case "status":
		if err := need(1, "a request id"); err != nil {
			return err
		}
		return call(http.MethodGet, "/agent/status/"+url.PathEscape(positional[0]), nil)
	case "query":
		if len(positional) == 0 {
			return errors.New("librarian query: expected the query text")
		}
		if *agent == "" && *token == "" {
			return errors.New("librarian query: name the agent to ask as with --agent ID (or CONCLAVE_LIBRARIAN_AGENT_ID), one of the Librarian's config/agents.yaml such as gemini-pro, or give an agent's --token")
		}
		q := map[string]any{"query": strings.Join(positional, " ")}
		if *agent != "" {
			q["agent_id"] = *agent
		}
		return call(http.MethodPost, "/agent/context", q)
	default: // review
		if len(positional) == 1 && positional[0] == "list" {
			return call(http.MethodGet, "/reviews?status=escalated", nil)
		}
		if len(positional) != 2 || (positional[0] != "approve" && positional[0] != "reject") {
			return errors.New("librarian review: expected list, or approve|reject REQUEST_ID -m COMMENT")
		}
		return call(http.MethodPost, "/reviews/"+url.PathEscape(positional[1])+"/decision",
			map[string]string{"decision": positional[0], "comment": *comment})
	}
}

type adminConfig struct {
	Storage config.Storage
}

func librarianAdmin(ctx context.Context, cmd string, args []string, lookup config.Lookup, stdout, stderr io.Writer) error {
	var positional []string
	var agent, reviewer string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case (a == "--agent" || a == "--reviewer") && i+1 < len(args):
			if a == "--agent" {
				agent = args[i+1]
			} else {
				reviewer = args[i+1]
			}
			i++
		case strings.HasPrefix(a, "-"):
			return fmt.Errorf("librarian %s: unknown flag %s", cmd, a)
		default:
			positional = append(positional, a)
		}
	}
	var cfg adminConfig
	if err := config.Load(ctx, &cfg, "conclave librarian "+cmd, nil, lookup, stderr); err != nil {
		return err
	}
	st, err := storage.OpenStore(ctx, cfg.Storage)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := store.EnsureTables(ctx, st, librarian.Tables...); err != nil {
		return err
	}
	admin := librarian.NewAdmin(st)
	switch {
	case cmd == "import" && len(positional) == 1:
		n, err := admin.Import(ctx, positional[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "imported %d nodes from %s\n", n, positional[0])
		return nil
	case cmd == "tokens" && len(positional) == 1 && positional[0] == "create" && (agent == "") != (reviewer == ""):
		subject, role := agent, librarian.RoleAgent
		if reviewer != "" {
			subject, role = reviewer, librarian.RoleReviewer
		}
		token, id, err := admin.CreateToken(ctx, subject, role)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "token %s for %s %s (shown once):\n%s\n", id, role, subject, token)
		return nil
	case cmd == "tokens" && len(positional) == 2 && positional[0] == "revoke":
		if err := admin.RevokeToken(ctx, positional[1]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked %s\n", positional[1])
		return nil
	}
	fmt.Fprint(stderr, librarianUsage)
	return fmt.Errorf("librarian %s: bad arguments %q", cmd, args)
}
