package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/conclave-ai/conclave/examples/coven-agent/agent"
)

// parseConfig reads the flags, each defaulting to its environment variable
// so the agent can be configured either way (a flag wins).
func parseConfig(args []string, getenv func(string) string, usage io.Writer) (agent.Config, error) {
	env := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("coven-agent", flag.ContinueOnError)
	fs.SetOutput(usage)
	addr := fs.String("addr", env("COVEN_AGENT_ADDR", "localhost:50051"), "gateway gRPC address (env COVEN_AGENT_ADDR)")
	id := fs.String("agent-id", env("COVEN_AGENT_ID", agent.NewID()), "agent ID, kept across reconnects (env COVEN_AGENT_ID; default random)")
	name := fs.String("name", env("COVEN_AGENT_NAME", "coven-agent"), "human-readable name (env COVEN_AGENT_NAME)")
	caps := fs.String("capabilities", env("COVEN_AGENT_CAPABILITIES", "chat"), "comma-separated capabilities (env COVEN_AGENT_CAPABILITIES)")
	// The variable is read after parsing, not made the flag's default, so
	// that usage text (printed on -h and on a bad flag) never shows it.
	token := fs.String("token", "", "bearer token for the gateway (env COVEN_AGENT_TOKEN)")
	heartbeat := fs.String("heartbeat", env("COVEN_AGENT_HEARTBEAT", "20s"), "heartbeat interval (env COVEN_AGENT_HEARTBEAT)")
	delay := fs.String("step-delay", env("COVEN_AGENT_STEP_DELAY", "150ms"), "pause between a reply's events, to watch it stream (env COVEN_AGENT_STEP_DELAY)")
	if err := fs.Parse(args); err != nil {
		return agent.Config{}, err
	}
	if fs.NArg() > 0 {
		return agent.Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *token == "" {
		*token = getenv("COVEN_AGENT_TOKEN")
	}
	hb, err := time.ParseDuration(*heartbeat)
	if err != nil || hb <= 0 {
		return agent.Config{}, fmt.Errorf("--heartbeat: want a positive duration such as 20s, got %q", *heartbeat)
	}
	sd, err := time.ParseDuration(*delay)
	if err != nil || sd < 0 {
		return agent.Config{}, fmt.Errorf("--step-delay: want a duration such as 150ms, got %q", *delay)
	}
	return agent.Config{
		Addr:         *addr,
		AgentID:      *id,
		Name:         *name,
		Capabilities: splitList(*caps),
		Token:        *token,
		Heartbeat:    hb,
		StepDelay:    sd,
	}, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
