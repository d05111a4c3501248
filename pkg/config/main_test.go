package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestMainCode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		code int
		out  string
	}{
		{"ok", nil, 0, ""},
		{"help", fmt.Errorf("flags: %w", ErrHelp), 0, ""},
		{"failure", errors.New("no store"), 1, "svc: no store\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			var gotArgs []string
			code := mainCode("svc", func(ctx context.Context, args []string) error {
				if ctx.Err() != nil {
					t.Error("run's context is done before it starts")
				}
				gotArgs = args
				return tc.err
			}, []string{"--x=1"}, &stderr)
			if code != tc.code || stderr.String() != tc.out || len(gotArgs) != 1 || gotArgs[0] != "--x=1" {
				t.Fatalf("code %d, stderr %q, args %q", code, stderr.String(), gotArgs)
			}
		})
	}
}
