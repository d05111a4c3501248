package main

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"COVEN_AGENT_ADDR":         "gw.example:443",
		"COVEN_AGENT_ID":           "from-env",
		"COVEN_AGENT_CAPABILITIES": "chat, code,,",
		"COVEN_AGENT_TOKEN":        "s3cret",
	}
	cfg, err := parseConfig([]string{"--agent-id", "from-flag", "--heartbeat=5s", "--step-delay=0s"},
		func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "gw.example:443" || cfg.AgentID != "from-flag" || cfg.Token != "s3cret" ||
		cfg.Heartbeat != 5*time.Second || cfg.StepDelay != 0 || cfg.Name != "coven-agent" {
		t.Errorf("config = %+v: flags should win over the environment, which wins over defaults", cfg)
	}
	if want := []string{"chat", "code"}; !reflect.DeepEqual(cfg.Capabilities, want) {
		t.Errorf("capabilities = %q, want %q", cfg.Capabilities, want)
	}
}

func TestParseConfigDefaultsToARandomID(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	a, errA := parseConfig(nil, noEnv, io.Discard)
	b, errB := parseConfig(nil, noEnv, io.Discard)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	if a.AgentID == "" || a.AgentID == b.AgentID || a.Addr != "localhost:50051" || a.Heartbeat != 20*time.Second {
		t.Errorf("defaults = %+v and %+v", a, b)
	}
}

func TestParseConfigRejects(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--heartbeat=0s"}, "--heartbeat"},
		{[]string{"--heartbeat=often"}, "--heartbeat"},
		{[]string{"--step-delay=-1s"}, "--step-delay"},
		{[]string{"stray"}, `unexpected argument "stray"`},
		{[]string{"--nope"}, "nope"},
	} {
		_, err := parseConfig(tt.args, func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseConfig(%q) = %v, want an error naming %s", tt.args, err, tt.want)
		}
	}
	if _, err := parseConfig([]string{"-h"}, func(string) string { return "" }, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v, want flag.ErrHelp", err)
	}
}

func TestUsageNeverShowsTheToken(t *testing.T) {
	t.Parallel()
	getenv := func(k string) string {
		if k == "COVEN_AGENT_TOKEN" {
			return "s3cret-from-env"
		}
		return ""
	}
	for _, args := range [][]string{{"-h"}, {"--nope"}} {
		var usage strings.Builder
		_, _ = parseConfig(args, getenv, &usage)
		if strings.Contains(usage.String(), "s3cret") {
			t.Errorf("%q: usage text shows the token:\n%s", args, usage.String())
		}
	}
	cfg, err := parseConfig(nil, getenv, io.Discard)
	if err != nil || cfg.Token != "s3cret-from-env" {
		t.Fatalf("token from the environment = %q, %v", cfg.Token, err)
	}
}
