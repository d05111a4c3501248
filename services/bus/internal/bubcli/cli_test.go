package bubcli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHelpAndTarget: help never dials the bus and names the program as it
// was run; --url and --token take over from BUB_BUS_URL and BUB_TOKEN.
func TestHelpAndTarget(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1 of loopback: a command that dials fails
	// naming the URL it dialled.
	const nowhere = "ws://127.0.0.1:1"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantOut string // in stdout and stderr together
		wantErr string // "" for none
	}{
		{"the program's help names it", []string{"-h"}, nil, "Usage: conclave bus <command>", ""},
		{"subscribe -h prints help, not a connection error", []string{"subscribe", "-h"}, map[string]string{"BUB_BUS_URL": nowhere}, "Usage: conclave bus subscribe PATTERN", ""},
		{"send-message -h", []string{"send-message", "-h"}, map[string]string{"BUB_BUS_URL": nowhere}, "-payload", ""},
		{"dlq -h", []string{"dlq", "-h"}, map[string]string{"BUB_BUS_URL": nowhere}, "-url", ""},
		{"--url takes over from BUB_BUS_URL", []string{"subscribe", "x:*", "--url", nowhere}, map[string]string{"BUB_BUS_URL": "ws://127.0.0.1:2"}, "", nowhere},
		{"BUB_BUS_URL without --url", []string{"subscribe", "x:*"}, map[string]string{"BUB_BUS_URL": nowhere}, "", nowhere},
		{"dlq with --url", []string{"dlq", "list", "--url", nowhere}, nil, "", "127.0.0.1:1"},
		{"subscribe without a pattern", []string{"subscribe"}, nil, "", "one PATTERN"},
		{"a stray argument to send-message", []string{"send-message", "oops", "--payload", "{}", "--topic", "t"}, nil, "", `"oops"`},
		{"an unknown command", []string{"publish"}, nil, "Usage: conclave bus", `unknown command "publish"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			env := Env{
				Name:   "conclave bus",
				Lookup: func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok },
				Stdin:  strings.NewReader(""), Stdout: &out, Stderr: &out,
			}
			err := Run(context.Background(), tt.args, env)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("%v: %v\n%s", tt.args, err, out.String())
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("%v: error %v, want one with %q", tt.args, err, tt.wantErr)
			case !strings.Contains(out.String(), tt.wantOut):
				t.Fatalf("%v printed:\n%s\nwant %q in it", tt.args, out.String(), tt.wantOut)
			}
		})
	}
}
