// Package bubcli is the bub command line: a bus client for people and for
// agents (which call it from their tools), printing one JSON object per
// line so that its output pipes into jq or another program.
package bubcli

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
	"sync"

	"github.com/coder/websocket"

	"github.com/conclave-ai/conclave/pkg/httpclient"
	"github.com/conclave-ai/conclave/pkg/jsonrpc"
)

// usage is the command's help; %[1]s is the program's name.
const usage = `Usage: %[1]s <command> [flags]

Commands:
  send-message --topic T --payload @file.json | - | '{...}'
                         publish a message and print the result with its acks
  subscribe PATTERN      print every message on topics matching PATTERN, one per line
  dlq list               print every dead letter, one per line
  dlq show ID            print one dead letter
  dlq redrive ID|--all   put dead letters back on the retry queue
  serve                  run the bus (the same settings as the bus deployable)

Every client command takes --url and --token (%[1]s COMMAND -h lists its flags).

Environment:
  BUB_BUS_URL        the bus, as --url does (default ws://127.0.0.1:7892)
  BUB_DEFAULT_TOPIC  the topic of send-message without --topic
  BUB_AGENT_ID       the clientId to initialize as (default bub-<pid>)
  BUB_TOKEN          the bearer token, as --token does, when the bus requires one
`

// Usage is the help of the command line run as name ("bub", "conclave bus").
func Usage(name string) string { return fmt.Sprintf(usage, name) }

// Env is the CLI's view of its environment.
type Env struct {
	// Name is the program's name in help and errors: "bub", "conclave bus".
	Name   string
	Lookup func(string) (string, bool)
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Serve runs the bus for `bub serve`.
	Serve func(ctx context.Context, args []string) error
}

func (e Env) get(key, def string) string {
	if v, ok := e.Lookup(key); ok && v != "" {
		return v
	}
	return def
}

// Run runs one bub command.
func Run(ctx context.Context, args []string, env Env) error {
	if env.Name == "" {
		env.Name = "bub"
	}
	if len(args) == 0 {
		fmt.Fprint(env.Stderr, Usage(env.Name))
		return errors.New("no command given")
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "send-message":
		return sendMessage(ctx, rest, env)
	case "subscribe":
		return subscribe(ctx, rest, env)
	case "dlq":
		return dlq(ctx, rest, env)
	case "serve":
		return env.Serve(ctx, rest)
	case "help", "-h", "--help":
		fmt.Fprint(env.Stdout, Usage(env.Name))
		return nil
	default:
		fmt.Fprint(env.Stderr, Usage(env.Name))
		return fmt.Errorf("unknown command %q", cmd)
	}
}

// target is where a client command reaches the bus: --url and --token,
// which default to BUB_BUS_URL and BUB_TOKEN.
type target struct {
	url, token string
}

// flags is a client command's flag set, with --url and --token; usage is
// its synopsis after the program's name.
func (e Env) flags(usage string) (*flag.FlagSet, *target) {
	fs := flag.NewFlagSet(e.Name+" "+usage, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.Stderr, "Usage: %s %s\n\nFlags:\n", e.Name, usage)
		fs.PrintDefaults()
	}
	t := &target{}
	fs.StringVar(&t.url, "url", e.get("BUB_BUS_URL", "ws://127.0.0.1:7892"), "the bus's WebSocket URL (BUB_BUS_URL)")
	fs.StringVar(&t.token, "token", e.get("BUB_TOKEN", ""), "bearer token, when the bus requires one (BUB_TOKEN)")
	return fs, t
}

// parse parses args with fs, letting flags follow the positional arguments,
// and returns those. help is true when -h was asked for: fs printed the
// usage, and the command has nothing more to do.
func parse(fs *flag.FlagSet, args []string) (positional []string, help bool, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, true, nil
			}
			return nil, false, err
		}
		if fs.NArg() == 0 {
			return positional, false, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// client is a connection to the bus, initialized.
type client struct {
	conn *jsonrpc.Conn
}

func connect(ctx context.Context, env Env, t *target, handler jsonrpc.Handler) (*client, error) {
	header := http.Header{}
	if t.token != "" {
		header.Set("Authorization", "Bearer "+t.token)
	}
	ws, _, err := websocket.Dial(ctx, t.url, &websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		return nil, fmt.Errorf("connecting to the bus at %s (--url, BUB_BUS_URL): %w", t.url, err)
	}
	conn := jsonrpc.NewConn(jsonrpc.NewWebSocketStream(ws, 0), handler)
	params := map[string]any{
		"clientId":   env.get("BUB_AGENT_ID", fmt.Sprintf("bub-%d", os.Getpid())),
		"clientInfo": map[string]string{"name": "bub", "version": "0.1.0"},
	}
	if t := env.get("BUB_DEFAULT_TOPIC", ""); t != "" {
		params["defaultTopic"] = t
	}
	if err := conn.Call(ctx, "initialize", params, nil); err != nil {
		conn.Close()
		return nil, fmt.Errorf("initialize: %w", err)
	}
	return &client{conn: conn}, nil
}

// printJSON writes v as one line.
func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// readPayload reads --payload: @file, - (stdin), or inline JSON.
func readPayload(arg string, stdin io.Reader) (json.RawMessage, error) {
	var data []byte
	var err error
	switch {
	case arg == "-":
		data, err = io.ReadAll(io.LimitReader(stdin, 4<<20))
	case strings.HasPrefix(arg, "@"):
		data, err = os.ReadFile(arg[1:])
	default:
		data = []byte(arg)
	}
	if err != nil {
		return nil, fmt.Errorf("--payload: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
		return nil, errors.New("--payload: not a JSON object")
	}
	return data, nil
}

func sendMessage(ctx context.Context, args []string, env Env) error {
	fs, t := env.flags("send-message --topic T --payload @file.json | - | '{...}'")
	topic := fs.String("topic", "", "topic (default BUB_DEFAULT_TOPIC)")
	payloadArg := fs.String("payload", "", "payload: @file.json, - for stdin, or inline JSON")
	positional, help, err := parse(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) != 0 {
		return fmt.Errorf("send-message: unexpected %q; the payload goes in --payload", positional[0])
	}
	if *payloadArg == "" {
		return errors.New("send-message: --payload is required")
	}
	payload, err := readPayload(*payloadArg, env.Stdin)
	if err != nil {
		return err
	}
	params := map[string]any{"payload": payload}
	if *topic != "" {
		params["topic"] = *topic
	} else if env.get("BUB_DEFAULT_TOPIC", "") == "" {
		return errors.New("send-message: give --topic or set BUB_DEFAULT_TOPIC")
	}
	c, err := connect(ctx, env, t, nil)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	var result json.RawMessage
	if err := c.conn.Call(ctx, "sendMessage", params, &result); err != nil {
		return fmt.Errorf("sendMessage: %w", err)
	}
	_, err = fmt.Fprintf(env.Stdout, "%s\n", result)
	return err
}

func subscribe(ctx context.Context, args []string, env Env) error {
	fs, t := env.flags("subscribe PATTERN")
	args, help, err := parse(fs, args)
	if help || err != nil {
		return err
	}
	if len(args) != 1 {
		return errors.New("subscribe: give exactly one PATTERN")
	}
	var mu sync.Mutex
	deliver := func(ctx context.Context, req *jsonrpc.Request) (any, error) {
		var msg struct {
			Topic   string          `json:"topic"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := req.DecodeParams(&msg); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if err := printJSON(env.Stdout, msg); err != nil {
			return nil, err
		}
		return map[string]any{"success": true, "processed": true, "stopPropagation": false}, nil
	}
	c, err := connect(ctx, env, t, jsonrpc.Methods{"sendMessage": deliver, "processMessage": deliver})
	if err != nil {
		return err
	}
	defer c.conn.Close()
	if err := c.conn.Call(ctx, "subscribe", map[string]string{"topic": args[0], "policy": "continueAll"}, nil); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	select {
	case <-ctx.Done():
		return nil
	case <-c.conn.Done():
		return fmt.Errorf("the bus closed the connection: %w", c.conn.Err())
	}
}

// httpBase turns the bus's WebSocket URL into its HTTP one.
func httpBase(t *target) (string, error) {
	u, err := url.Parse(t.url)
	if err != nil {
		return "", fmt.Errorf("--url (BUB_BUS_URL): %w", err)
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	}
	u.Path = ""
	return strings.TrimSuffix(u.String(), "/"), nil
}

func dlqRequest(ctx context.Context, t *target, method, path string, out any) error {
	base, err := httpBase(t)
	if err != nil {
		return err
	}
	c := httpclient.New(base, t.token)
	// A page of dead letters holds whole messages.
	c.MaxResponse = 64 << 20
	return c.JSON(ctx, method, path, nil, out)
}

func dlq(ctx context.Context, args []string, env Env) error {
	fs, t := env.flags("dlq list | show ID | redrive ID|--all")
	all := fs.Bool("all", false, "with redrive: every dead letter")
	args, help, err := parse(fs, args)
	if help || err != nil {
		return err
	}
	if *all {
		args = append(args, "--all")
	}
	if len(args) == 0 {
		return errors.New("dlq: give list, show ID or redrive ID|--all")
	}
	switch args[0] {
	case "list":
		cursor := ""
		for {
			var page struct {
				DeadLetters []json.RawMessage `json:"dead_letters"`
				Cursor      string            `json:"cursor"`
			}
			if err := dlqRequest(ctx, t, "GET", "/v1/dead-letters?cursor="+url.QueryEscape(cursor), &page); err != nil {
				return err
			}
			for _, dl := range page.DeadLetters {
				if _, err := fmt.Fprintf(env.Stdout, "%s\n", dl); err != nil {
					return err
				}
			}
			if page.Cursor == "" {
				return nil
			}
			cursor = page.Cursor
		}
	case "show":
		if len(args) != 2 {
			return errors.New("dlq show: give one ID")
		}
		var dl json.RawMessage
		if err := dlqRequest(ctx, t, "GET", "/v1/dead-letters/"+url.PathEscape(args[1]), &dl); err != nil {
			return err
		}
		_, err := fmt.Fprintf(env.Stdout, "%s\n", dl)
		return err
	case "redrive":
		if len(args) != 2 {
			return errors.New("dlq redrive: give one ID or --all")
		}
		path := "/v1/dead-letters/" + url.PathEscape(args[1]) + "/redrive"
		if args[1] == "--all" {
			path = "/v1/dead-letters/redrive"
		}
		var out json.RawMessage
		if err := dlqRequest(ctx, t, "POST", path, &out); err != nil {
			return err
		}
		_, err := fmt.Fprintf(env.Stdout, "%s\n", out)
		return err
	}
	return fmt.Errorf("dlq: unknown subcommand %q", args[0])
}
